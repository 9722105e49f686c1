// The Builder's quantizers: which fake-quant chain sits where is decided here from the
// QConfig, so the layer files never look at bit widths.
#include "nn/builder.h"

#include <algorithm>

#include "core/error.h"
#include "core/op_registry.h"

namespace qg::nn {
namespace {

// The observer op for a QConfig. The moving-average observer is used when the registry has
// it; builds without it fall back to the running min/max observer.
std::string observer_op(const QConfig& qc, double averaging_constant, Attrs& attrs) {
  if (qc.observer == ObserverKind::moving_average &&
      OpRegistry::instance().find("moving_average_observer") != nullptr) {
    attrs.set("averaging_constant", averaging_constant);
    return "moving_average_observer";
  }
  return "minmax_observer";
}

// Parameters are drawn in f32 (so a seed gives the same values whatever the policy) and
// stored in the policy's parameter dtype.
Tensor in_parameter_dtype(const Tensor& f32, const PrecisionPolicy& precision) {
  if (precision.parameter == DType::f32) return f32;
  return Tensor::from_doubles(f32.shape(), f32.to_doubles(), precision.parameter);
}

}  // namespace

Builder::Builder(Graph& graph, QConfig qconfig, uint64_t seed, PrecisionPolicy precision)
    : g_(graph), qc_(std::move(qconfig)), precision_(precision), rng_(seed) {
  precision_.validate();
  qc_.validate();
}

ValueId Builder::uniform_parameter(const std::string& name, const Shape& shape, double bound) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng_.uniform(-bound, bound));
  ValueId v = g_.parameter(name, in_parameter_dtype(t, precision_));
  params_.push_back(v);
  return v;
}

ValueId Builder::filled_parameter(const std::string& name, const Shape& shape, double value,
                                  bool trainable) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(value);
  ValueId v = g_.parameter(name, in_parameter_dtype(t, precision_));
  if (trainable) params_.push_back(v);
  return v;
}

ValueId Builder::act(ValueId x, const std::string& name, NodeId* observer) {
  if (!qc_.static_activations()) return x;
  // Unsigned per-tensor affine (quint8 0..255, or 0..15 for 4-bit activations): PyTorch's
  // default QAT activation fake-quant.
  const int64_t bits = qc_.activation_bits();
  Attrs obs_attrs{{"bits", bits}, {"signed", false}, {"qscheme", "affine"}};
  std::string op = observer_op(qc_, qc_.averaging_constant, obs_attrs);
  auto qp = g_.apply(op, {x}, obs_attrs, name + ".observer");
  if (observer != nullptr) *observer = g_.value(qp[0]).producer;
  return g_.apply("fake_quantize", {x, qp[0], qp[1]}, {{"bits", bits}, {"signed", false}},
                  name + ".fq")[0];
}

ValueId Builder::to_compute(ValueId v, const std::string& name) {
  if (!precision_.mixed() || g_.value(v).type.dtype == precision_.compute) return v;
  return g_.apply1("cast", {v}, {{"dtype", dtype_name(precision_.compute)}}, name + ".to_compute");
}

ValueId Builder::to_parameter(ValueId v, const std::string& name) {
  if (g_.value(v).type.dtype == precision_.parameter) return v;
  return g_.apply1("cast", {v}, {{"dtype", dtype_name(precision_.parameter)}},
                   name + ".to_parameter");
}

ValueId Builder::quant_input(ValueId x, const std::string& name) {
  return act(x, name, &input_observer_);
}

// torchao's per-token dynamic asymmetric int8 fake-quant (its 8da4w activations): one
// dynamic_fake_quantize node, qparams from each token's own range (the last axis is the
// feature axis) in x's dtype, the STE through its mask.
ValueId Builder::dynamic_token_quant(ValueId x, const std::string& name) {
  const Shape& shape = shape_of_value(g_, x);
  if (shape.size() != 4)
    return g_.apply("dynamic_fake_quantize", {x}, dynamic_activation_attrs(qc_), name + ".dfq")[0];
  // 4-D (conv) inputs: one dynamic range per tensor (torchao has no conv recipe), composed:
  // y = stop_gradient(yq) + (x - stop_gradient(x)); x - x is exactly 0 for finite x, so
  // y == yq bit for bit while dy/dx = 1.
  const std::string scope = "tensor";
  Attrs a{
      {"bits", 8}, {"signed", true}, {"narrow_range", false}, {"mode", "affine"}, {"scope", scope}};
  auto q = g_.apply("dynamic_range_quantize", {x}, a, name + ".dynq");
  ValueId xq =
      g_.apply1("dequantize", {q[0], q[1], q[2]}, {{"scope", scope}}, name + ".dequantize");
  // dequantize gives f32; a 16-bit x (a mixed-precision GEMM's output feeding the next GEMM)
  // gets its values back in its own dtype, which holds them exactly (codes of 8 bits times
  // the scale).
  const DType dtype = g_.value(x).type.dtype;
  if (g_.value(xq).type.dtype != dtype)
    xq = g_.apply1("cast", {xq}, {{"dtype", dtype_name(dtype)}}, name + ".dequantize.cast");
  ValueId zero = g_.apply1("sub", {x, g_.apply1("stop_gradient", {x})}, {}, name + ".ste_zero");
  return g_.apply1("add", {g_.apply1("stop_gradient", {xq}), zero}, {}, name + ".ste");
}

ValueId Builder::gemm_input(ValueId x, const std::string& name) {
  if (!qc_.dynamic_activations()) return x;
  return dynamic_token_quant(x, name);
}

ValueId Builder::weight(ValueId w, const std::string& layer) {
  if (qc_.weight == WeightQuant::none) return w;
  const Shape shape = shape_of_value(g_, w);
  QG_CHECK(shape.size() >= 2, "nn", "layer '", layer, "': a weight needs rank >= 2, got ",
           shape_str(shape));
  const int64_t out = shape[0], in = shape_numel(shape) / shape[0];
  // Dynamic weights are torchao's: a row narrower than one group is one group (its qparam
  // functions clamp the group size so), and otherwise the groups must split each row evenly
  // (observed weights allow a shorter last group).
  const int64_t group = std::min<int64_t>(qc_.weight_group_size, in);
  QG_CHECK(!qc_.dynamic_weights || qc_.weight_scope != "group" || in % group == 0, "nn", "layer '",
           layer, "': weight group size ", qc_.weight_group_size, " does not divide its ", in,
           " inputs (", qc_.str(), ")");
  const std::string name = layer + ".weight";
  WeightQuantizer rec;
  rec.layer = layer;
  // Quantizers see the weight as [out, in]: per-channel qparams on axis 0, groups along
  // the inputs (for a conv weight: in_channels * kh * kw, PyTorch's flattening order).
  rec.source = shape.size() == 2
                   ? w
                   : g_.apply1("reshape", {w}, {{"shape", Shape{out, in}}}, name + ".as_matrix");
  if (qc_.learned_weight_ranges) {
    rec.quantized = learned_weight(rec, group, name);
  } else if (qc_.dynamic_weights) {
    // torchao's QAT weights: qparams from the current weights on every call, one node.
    Attrs attrs = dynamic_weight_attrs(qc_, g_.value(rec.source).type.dtype);
    if (qc_.weight_scope == "group") attrs.set("group_size", group);
    auto q = g_.apply("dynamic_fake_quantize", {rec.source}, attrs, name + ".dfq");
    rec.observer = g_.value(q[2]).producer;
    rec.qparam_output = 2;
    rec.quantized = q[0];
  } else if (qc_.weight == WeightQuant::nf4) {
    QG_CHECK(OpRegistry::instance().find("nf4_quantize_pack") != nullptr, "nn",
             "NF4 weights need the op 'nf4_quantize_pack', which this build does not register");
    // NF4 round trip per group of nf4_group_size weights along each row, with the same
    // straight-through estimator as dynamic_token_quant.
    Attrs layout{{"group_size", static_cast<int64_t>(qc_.nf4_group_size)}, {"axis", -1}};
    auto packed = g_.apply("nf4_quantize_pack", {rec.source}, layout, name + ".nf4_pack");
    rec.nf4_pack = g_.value(packed[0]).producer;
    Attrs unpack = layout;
    unpack.set("shape", Shape{out, in});
    ValueId wq = g_.apply1("nf4_unpack_dequantize", {packed[0], packed[1]}, unpack, name + ".fq");
    ValueId zero = g_.apply1("sub", {rec.source, g_.apply1("stop_gradient", {rec.source})}, {},
                             name + ".ste_zero");
    rec.quantized = g_.apply1("add", {g_.apply1("stop_gradient", {wq}), zero}, {}, name + ".ste");
  } else {
    // Symmetric signed, full range (-128..127, -8..7, -2..1), zero point 0: PyTorch's
    // default_per_channel_weight_fake_quant for int8; torchao's group-wise int4 for "group".
    Attrs range{{"bits", static_cast<int64_t>(qc_.weight_bits())}, {"signed", true}};
    Attrs scope{{"scope", qc_.weight_scope}};
    if (qc_.weight_scope == "channel") scope.set("axis", 0);
    if (qc_.weight_scope == "group") {
      scope.set("axis", 1);
      scope.set("group_size", static_cast<int64_t>(qc_.weight_group_size));
    }
    Attrs obs_attrs = range;
    obs_attrs.set("qscheme", "symmetric");
    obs_attrs.set("replicated", true);  // weights are the same on every data-parallel rank
    for (const auto& [k, v] : scope.items()) obs_attrs.set(k, v);
    std::string op = observer_op(qc_, qc_.weight_averaging_constant, obs_attrs);
    auto qp = g_.apply(op, {rec.source}, obs_attrs, name + ".observer");
    rec.observer = g_.value(qp[0]).producer;
    Attrs fq_attrs = range;
    for (const auto& [k, v] : scope.items()) fq_attrs.set(k, v);
    rec.quantized =
        g_.apply("fake_quantize", {rec.source, qp[0], qp[1]}, fq_attrs, name + ".fq")[0];
  }
  weights_.push_back(rec);
  if (shape.size() == 2) return rec.quantized;
  return g_.apply1("reshape", {rec.quantized}, {{"shape", shape}}, name + ".as_kernel");
}

ValueId Builder::cross_entropy(ValueId logits, ValueId labels) {
  return g_.apply1("softmax_cross_entropy", {logits, labels}, {{"reduction", "mean"}}, "loss");
}

}  // namespace qg::nn
