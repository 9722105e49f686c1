#include "nn/convert.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "nn/convert_float_zero.h"
#include "nn/llama_embedding.h"
#include "ops/common/quant_math.h"
#include "runtime/compile.h"

namespace qg::nn {
namespace {

Executor::Feeds zero_feeds(const Graph& g) {
  Executor::Feeds feeds;
  for (ValueId in : g.inputs()) {
    const Value& v = g.value(in);
    feeds[v.name] = Tensor::zeros(v.type.shape, v.type.dtype);
  }
  return feeds;
}

void rewire(Graph& g, ValueId from, ValueId to) {
  for (NodeId c : g.consumers(from)) {
    const Node& n = g.node(c);
    if (n.dead) continue;
    for (size_t slot = 0; slot < n.inputs.size(); ++slot)
      if (n.inputs[slot] == from) g.replace_input(c, static_cast<int>(slot), to);
  }
}

std::vector<float> floats(const Tensor& t) {
  Tensor c = t.to(Device::cpu());
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// The integer codes of one weight quantizer, and the nodes that dequantize them.
ValueId integer_weight(Graph& g, const WeightQuantizer& w, const QConfig& qc,
                       const std::vector<Tensor>& fetched) {
  const Shape shape = g.value(w.quantized).type.shape;  // [out, in]
  const int64_t out = shape[0], in = shape[1];
  const std::string name = w.layer + ".weight.int";
  if (w.nf4_pack >= 0) {
    const Node& pack = g.node(w.nf4_pack);
    Attrs a = pack.attrs;
    a.set("shape", shape);
    ValueId codes = g.constant(fetched[0].to(Device::cpu()), name + ".codes");
    ValueId absmax = g.constant(fetched[1].to(Device::cpu()), name + ".absmax");
    return g.apply1("nf4_unpack_dequantize", {codes, absmax}, a, name + ".dequantize");
  }
  const std::vector<float> src = floats(fetched[0]);
  Tensor scale_t = fetched[1].to(Device::cpu()), zp_t = fetched[2].to(Device::cpu());
  const std::vector<float> scale = floats(scale_t);
  const int32_t* zp = zp_t.data<int32_t>();
  for (int64_t i = 0; i < zp_t.numel(); ++i)
    QG_CHECK(zp[i] == 0, "convert", "layer '", w.layer, "': weight zero point ", zp[i],
             " should be 0 for a symmetric signed weight quantizer");
  const int bits = qc.weight_bits();
  const float qmin = -static_cast<float>(1 << (bits - 1)),
              qmax = static_cast<float>((1 << (bits - 1)) - 1);
  const bool group = qc.weight_scope == "group", tensor = qc.weight_scope == "tensor";
  const int64_t gs = group ? qc.weight_group_size : in;
  const int64_t groups = (in + gs - 1) / gs;
  auto qparam = [&](int64_t o, int64_t k) -> int64_t {
    return tensor ? 0 : group ? o * groups + k / gs : o;
  };
  std::vector<int32_t> codes(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      const float s = scale[static_cast<size_t>(qparam(o, k))];
      codes[o * in + k] = qmath::quantize_code<float>(src[o * in + k], 1.0f / s, 0.0f, qmin, qmax);
    }
  if (bits <= 4) {
    // Packed INT4, two codes per byte in flat C order (stored code + 8), one (scale, zero
    // point 8) per row group; channel and tensor scopes are one group per row. int2 codes
    // (-2..1) use the same nibbles: there is no 2-bit storage op.
    std::vector<uint8_t> packed(static_cast<size_t>((out * in + 1) / 2), 0);
    for (int64_t i = 0; i < out * in; ++i) {
      uint8_t v = static_cast<uint8_t>(codes[i] + 8);
      packed[i / 2] |= (i % 2 == 0) ? v : static_cast<uint8_t>(v << 4);
    }
    std::vector<float> row_scale(static_cast<size_t>(out * groups));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t gi = 0; gi < groups; ++gi)
        row_scale[o * groups + gi] = scale[qparam(o, gi * gs)];
    Shape qshape{out, groups};
    ValueId p =
        g.constant(Tensor::from_vector<uint8_t>({static_cast<int64_t>(packed.size())}, packed),
                   name + ".codes");
    ValueId s = g.constant(Tensor::from_vector<float>(qshape, row_scale), name + ".scale");
    ValueId z =
        g.constant(Tensor::from_vector<uint8_t>(qshape, std::vector<uint8_t>(row_scale.size(), 8)),
                   name + ".zero_point");
    return g.apply1("int4_unpack_dequantize", {p, s, z},
                    {{"group_size", gs}, {"axis", -1}, {"shape", shape}}, name + ".dequantize");
  }
  std::vector<int8_t> c8(codes.begin(), codes.end());
  ValueId c = g.constant(Tensor::from_vector<int8_t>(shape, c8), name + ".codes");
  ValueId s = g.constant(scale_t, name + ".scale");
  ValueId z = g.constant(zp_t, name + ".zero_point");
  Attrs a{{"scope", qc.weight_scope}};
  if (qc.weight_scope == "channel") a.set("axis", 0);
  if (group) {
    a.set("axis", 1);
    a.set("group_size", gs);
  }
  return g.apply1("dequantize", {c, s, z}, a, name + ".dequantize");
}

// The integer forward's layer deployed: int8_matmul on the same activation codes and qparams
// and on the weight codes and scales as constants, so it computes what int8_matmul_ste did.
// Codes of at most 4 bits are stored as packed INT4 nibbles (code + 8, two per byte, flat C
// order, as integer_weight packs them) and unpacked to the GEMM's int8 each forward: the
// unpack-dequantize with scale 1 and zero point 8 gives the codes as exact f32 integers, and
// quantize with scale 1 and zero point 0 turns them back into i8 unchanged.
ValueId integer_gemm(Graph& g, const WeightQuantizer& w, const QConfig& qc,
                     const std::vector<Tensor>& fetched) {
  const Node ste = g.node(w.integer_gemm);  // a copy: the graph grows below
  const std::string name = w.layer + ".weight.int";
  Tensor codes_t = fetched[0].to(Device::cpu());
  ValueId codes;
  const int bits = qc.weight_bits();
  if (bits <= 4) {
    const int64_t out = codes_t.size(0), in = codes_t.size(1), n = codes_t.numel();
    std::vector<uint8_t> packed(static_cast<size_t>((n + 1) / 2), 0);
    const int8_t* c = codes_t.data<int8_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t v = static_cast<uint8_t>(c[i] + 8);
      packed[i / 2] |= (i % 2 == 0) ? v : static_cast<uint8_t>(v << 4);
    }
    const ValueId p =
        g.constant(Tensor::from_vector<uint8_t>({static_cast<int64_t>(packed.size())}, packed),
                   name + ".codes");
    const ValueId one = g.constant(Tensor::from_vector<float>({out, 1}, std::vector<float>(out, 1)),
                                   name + ".unpack_scale");
    const ValueId eight =
        g.constant(Tensor::from_vector<uint8_t>({out, 1}, std::vector<uint8_t>(out, 8)),
                   name + ".unpack_zero");
    const ValueId values =
        g.apply1("int4_unpack_dequantize", {p, one, eight},
                 {{"group_size", in}, {"axis", -1}, {"shape", Shape{out, in}}}, name + ".unpack");
    const ValueId unit = g.constant(Tensor::from_vector<float>({1}, {1.0f}), name + ".unit");
    const ValueId zero = g.constant(Tensor::from_vector<int32_t>({1}, {0}), name + ".zero");
    codes = g.apply("quantize", {values, unit, zero},
                    {{"quant_min", -(int64_t{1} << (bits - 1))},
                     {"quant_max", (int64_t{1} << (bits - 1)) - 1},
                     {"out_dtype", std::string("i8")}},
                    name + ".to_i8")[0];
  } else {
    codes = g.constant(codes_t, name + ".codes");
  }
  const ValueId scale = g.constant(fetched[1].to(Device::cpu()), name + ".scale");
  Attrs a = ste.attrs;
  a.set("out_dtype", std::string(dtype_name(g.value(ste.outputs[0]).type.dtype)));
  return g.apply1("int8_matmul", {ste.inputs[2], ste.inputs[3], ste.inputs[4], codes, scale}, a,
                  name + ".matmul");
}

}  // namespace

void copy_states(Executor& from, Executor& to) {
  // Keyed by the nodes as built (runtime/compile.h), so a fused graph and an unfused one
  // exchange states; written in place, so a compiled step bound to `to` sees them.
  std::map<std::string, Tensor*> source = state_index(from);
  std::map<std::string, Tensor*> target = state_index(to);
  for (auto& [key, d] : target) {
    auto it = source.find(key);
    QG_CHECK(it != source.end(), "copy_states", "state '", key,
             "' has no counterpart in the source graph");
    const Tensor& s = *it->second;
    QG_CHECK(s.dtype() == d->dtype() && s.shape() == d->shape(), "copy_states", "state '", key,
             "' is ", d->str(), " here but ", s.str(), " in the source graph");
    Tensor src = s.is_contiguous() ? s : s.to(s.device());
    copy_bytes(d->raw_data(), d->device(), src.raw_data(), src.device(), d->nbytes());
  }
}

ModelInstance build_instance(ModelSpec spec, int64_t batch, const QConfig& qconfig, Device device) {
  spec.mlp.batch = batch;
  ModelInstance inst;
  inst.graph = std::make_unique<Graph>();
  inst.model = build_model(*inst.graph, spec, qconfig, 0);
  inst.exec = std::make_unique<Executor>(*inst.graph, device);
  inst.exec->set_training(false);
  return inst;
}

namespace {

// What the conversion pass rewrites in a model's forward graph, whatever the model kind.
struct ConvertTarget {
  Graph& graph;
  std::unique_ptr<Executor>& exec;
  const std::vector<WeightQuantizer>& weights;
  const std::vector<ConvBnLayer>& conv_bns;
  ValueId logits;
  Executor::Feeds feeds;  // any inputs: the pass fetches only states and what they give
};

int64_t convert_graph(ConvertTarget t, const QConfig& qc) {
  Graph& g = t.graph;
  Executor& ex = *t.exec;
  // 1. Everything the pass reads, in eval mode (observers and batch norms frozen).
  std::vector<ValueId> fetch;
  for (const WeightQuantizer& w : t.weights) {
    if (w.integer_gemm >= 0) {
      // The integer forward: the weight codes and scales its int8_matmul_ste reads.
      fetch.push_back(g.node(w.integer_gemm).inputs[5]);
      fetch.push_back(g.node(w.integer_gemm).inputs[6]);
    } else if (w.nf4_pack >= 0) {
      fetch.push_back(g.node(w.nf4_pack).outputs[0]);
      fetch.push_back(g.node(w.nf4_pack).outputs[1]);
    } else {
      fetch.push_back(w.source);
      if (w.learned_scale != kNoValue) {
        // Learned ranges: the scale parameter; the zero point is 0 (filled in below).
        fetch.push_back(w.learned_scale);
        fetch.push_back(w.learned_scale);
        continue;
      }
      const Node& qp = g.node(w.observer);
      fetch.push_back(qp.outputs[w.qparam_output]);
      fetch.push_back(qp.outputs[w.qparam_output + 1]);
    }
  }
  // Unfolded (float-weight) blocks keep their batch_norm, which eval mode runs on the
  // running statistics: nothing to rewrite.
  for (const ConvBnLayer& c : t.conv_bns)
    if (c.folded)
      for (ValueId v : {c.gamma, c.beta, c.running_mean, c.running_var}) fetch.push_back(v);
  ex.set_training(false);
  std::vector<Tensor> got = ex.run(t.feeds, fetch);
  for (Tensor& t : got) t = t.to(Device::cpu());
  // 2. Rewrite the graph.
  size_t k = 0;
  for (const WeightQuantizer& w : t.weights) {
    const size_t n = w.nf4_pack >= 0 || w.integer_gemm >= 0 ? 2 : 3;
    std::vector<Tensor> mine(got.begin() + k, got.begin() + k + n);
    k += n;
    if (w.integer_gemm >= 0) {
      rewire(g, g.node(w.integer_gemm).outputs[0], integer_gemm(g, w, qc, mine));
      continue;
    }
    if (w.learned_scale != kNoValue) {
      // The codes are computed in f32 as lsq_fake_quantize computes them from an f32 scale.
      mine[1] = Tensor::from_doubles(mine[1].shape(), mine[1].to_doubles(), DType::f32);
      mine[2] = Tensor::zeros(mine[1].shape(), DType::i32);
    }
    // Learned ranges are symmetric only (QConfig::validate), so never float-zero.
    const bool float_zero = w.learned_scale == kNoValue && qc.dynamic_weights &&
                            qc.weight_mapping == WeightMapping::float_zero;
    rewire(g, w.quantized,
           float_zero ? float_zero_integer_weight(g, w, mine) : integer_weight(g, w, qc, mine));
  }
  for (const ConvBnLayer& c : t.conv_bns) {
    if (!c.folded) continue;
    std::vector<float> gamma = floats(got[k]), beta = floats(got[k + 1]), mean = floats(got[k + 2]),
                       var = floats(got[k + 3]);
    k += 4;
    const int64_t ch = static_cast<int64_t>(gamma.size());
    std::vector<float> bias(gamma.size());
    for (size_t i = 0; i < gamma.size(); ++i) {
      // The same f32 steps as the graph: std = sqrt(var + eps), sf = gamma / std.
      const float sf = gamma[i] / std::sqrt(var[i] + static_cast<float>(c.eps));
      bias[i] = beta[i] - mean[i] * sf;
    }
    ValueId b = g.constant(Tensor::from_vector<float>({1, ch, 1, 1}, bias), c.name + ".fold_bias");
    rewire(g, c.bn_out, g.apply1("add", {c.conv, b}, {}, c.name + ".add_fold_bias"));
  }
  // 3. A fresh executor over the rewritten graph, holding the same states.
  auto fresh = std::make_unique<Executor>(g, ex.device());
  copy_states(ex, *fresh);
  fresh->set_training(false);
  t.exec = std::move(fresh);
  // 4. Bytes of what the logits still need.
  int64_t bytes = 0;
  std::vector<bool> needed = g.needed_nodes({t.logits});
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    if (!needed[id]) continue;
    const Node& n = g.node(id);
    if (n.op->name == "parameter" || n.op->name == "constant") {
      const TensorType& t = g.value(n.outputs[0]).type;
      bytes += shape_numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
    } else if (n.op->name.find("observer") != std::string::npos) {
      bytes += 8 * shape_numel(g.value(n.outputs[0]).type.shape);
    }
  }
  return bytes;
}

}  // namespace

int64_t convert_to_integer(ModelInstance& inst, const QConfig& qc) {
  return convert_graph({*inst.graph, inst.exec, inst.model.weights, inst.model.conv_bns,
                        inst.model.logits, zero_feeds(*inst.graph)},
                       qc);
}

LlamaInstance build_llama_instance(const LlamaConfig& config, int64_t batch, int64_t seq,
                                   const QConfig& qconfig, Device device,
                                   const PrecisionPolicy& precision) {
  LlamaInstance inst;
  inst.graph = std::make_unique<Graph>();
  inst.model = build_llama(*inst.graph, config, batch, seq, qconfig, 0, precision);
  inst.exec = std::make_unique<Executor>(*inst.graph, device);
  inst.exec->set_training(false);
  return inst;
}

int64_t convert_to_integer(LlamaInstance& inst, const QConfig& qc) {
  // Token id 0 for every input: any valid ids do, the pass reads states only.
  static const std::vector<ConvBnLayer> kNone;
  // A quantized embedding first, with its own weight QConfig (its codes then also serve a tied
  // lm_head, which reads the same fake-quantized table).
  if (!inst.model.embedding_weights.empty())
    convert_graph({*inst.graph, inst.exec, inst.model.embedding_weights, kNone, inst.model.logits,
                   zero_feeds(*inst.graph)},
                  embedding_weight_qconfig(qc));
  return convert_graph({*inst.graph, inst.exec, inst.model.weights, kNone, inst.model.logits,
                        zero_feeds(*inst.graph)},
                       qc);
}

}  // namespace qg::nn
