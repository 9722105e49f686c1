#include "nn/quantized.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/common/quant_math.h"
#include "runtime/compile.h"

namespace qg::nn {
namespace {

// The NF4 code table (SEMANTICS.md, identical to bitsandbytes).
constexpr float kNf4[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};

// uint8 activation round trip with the observer's frozen qparams: the value the next layer
// reads is (code - zp) * scale, exactly what fake_quantize produces.
float act_round_trip(float x, const ActQParams& a) {
  if (!a.enabled) return x;
  const float inv = 1.0f / a.scale;
  int32_t code =
      qmath::quantize_code<float>(x, inv, static_cast<float>(a.zero_point), 0.0f, 255.0f);
  return (static_cast<float>(code) - static_cast<float>(a.zero_point)) * a.scale;
}

uint8_t nibble(const std::vector<uint8_t>& packed, int64_t row_bytes, int64_t r, int64_t c) {
  uint8_t b = packed[static_cast<size_t>(r * row_bytes + c / 2)];
  return (c % 2 == 0) ? (b & 0x0f) : (b >> 4);
}

// Row r of the weight, dequantized into `w` (the on-the-fly step).
void dequantize_row(const QuantizedLinear& l, int64_t r, float* w) {
  const int64_t row_bytes = (l.in + 1) / 2;
  switch (l.kind) {
    case WeightQuant::none:
      std::copy(l.weight_f32.begin() + r * l.in, l.weight_f32.begin() + (r + 1) * l.in, w);
      break;
    case WeightQuant::int8: {
      float s = l.scales[l.scales.size() == 1 ? 0 : r];
      for (int64_t c = 0; c < l.in; ++c) w[c] = static_cast<float>(l.codes8[r * l.in + c]) * s;
      break;
    }
    case WeightQuant::int4: {
      float s = l.scales[l.scales.size() == 1 ? 0 : r];
      for (int64_t c = 0; c < l.in; ++c)
        w[c] = static_cast<float>(static_cast<int>(nibble(l.packed, row_bytes, r, c)) - 8) * s;
      break;
    }
    case WeightQuant::nf4: {
      const int64_t groups_per_row = (l.in + l.group_size - 1) / l.group_size;
      for (int64_t c = 0; c < l.in; ++c)
        w[c] = nf4_value(nibble(l.packed, row_bytes, r, c)) *
               l.scales[r * groups_per_row + c / l.group_size];
      break;
    }
    case WeightQuant::int3:  // convert_to_quantized refuses them; nn/convert.h stores them
    case WeightQuant::int2:
      QG_FAIL("nn", "QuantizedMlp has no ", weight_quant_name(l.kind), " layer '", l.name, "'");
  }
}

void set_nibble(std::vector<uint8_t>& packed, int64_t row_bytes, int64_t r, int64_t c, uint8_t v) {
  uint8_t& b = packed[static_cast<size_t>(r * row_bytes + c / 2)];
  b = (c % 2 == 0) ? static_cast<uint8_t>((b & 0xf0) | v)
                   : static_cast<uint8_t>((b & 0x0f) | (v << 4));
}

QuantizedLinear convert_layer(Executor& ex, const LinearLayer& l, const QConfig& qc) {
  QuantizedLinear q;
  q.name = l.name;
  q.in = l.in_features;
  q.out = l.out_features;
  q.kind = qc.weight;
  q.relu = l.relu;
  Tensor w = ex.parameter(ex.graph().value(l.weight).name).to(Device::cpu());
  Tensor b = ex.parameter(ex.graph().value(l.bias).name).to(Device::cpu());
  const float* pw = w.data<float>();
  q.bias.assign(b.data<float>(), b.data<float>() + b.numel());
  const int64_t row_bytes = (q.in + 1) / 2;
  if (q.kind == WeightQuant::none) {
    q.weight_f32.assign(pw, pw + w.numel());
  } else if (q.kind == WeightQuant::nf4) {
    // Groups of nf4_group_size along each row (the last group of a row may be shorter), as
    // nf4_quantize_pack lays them out with axis = -1.
    q.group_size = qc.nf4_group_size;
    q.packed.assign(static_cast<size_t>(q.out * row_bytes), 0);
    for (int64_t r = 0; r < q.out; ++r)
      for (int64_t g0 = 0; g0 < q.in; g0 += q.group_size) {
        int64_t g1 = std::min(q.in, g0 + q.group_size);
        float absmax = 0.0f;
        for (int64_t c = g0; c < g1; ++c)
          if (std::isfinite(pw[r * q.in + c]))
            absmax = std::max(absmax, std::fabs(pw[r * q.in + c]));
        float scale = absmax > 0.0f ? absmax : 1.0f;  // an all-zero group dequantizes to 0 anyway
        const float inv = 1.0f / scale;
        q.scales.push_back(scale);
        for (int64_t c = g0; c < g1; ++c)
          set_nibble(q.packed, row_bytes, r, c, nf4_code(pw[r * q.in + c] * inv));
      }
  } else {
    auto [scale, zp] = observer_qparams(ex, l.weight_observer);
    q.scales = scale;
    const float qmin = q.kind == WeightQuant::int8 ? -128.0f : -8.0f;
    const float qmax = q.kind == WeightQuant::int8 ? 127.0f : 7.0f;
    if (q.kind == WeightQuant::int8) q.codes8.resize(static_cast<size_t>(w.numel()));
    if (q.kind == WeightQuant::int4) q.packed.assign(static_cast<size_t>(q.out * row_bytes), 0);
    for (int64_t r = 0; r < q.out; ++r) {
      size_t qi = scale.size() == 1 ? 0 : static_cast<size_t>(r);
      QG_CHECK(zp[qi] == 0, "quantize", "layer '", l.name, "' weight zero point ", zp[qi],
               " should be 0 for a symmetric signed weight quantizer");
      const float inv = 1.0f / scale[qi];
      for (int64_t c = 0; c < q.in; ++c) {
        int32_t code = qmath::quantize_code<float>(pw[r * q.in + c], inv, 0.0f, qmin, qmax);
        if (q.kind == WeightQuant::int8)
          q.codes8[r * q.in + c] = static_cast<int8_t>(code);
        else
          set_nibble(q.packed, row_bytes, r, c, static_cast<uint8_t>(code + 8));
      }
    }
  }
  if (l.output_observer >= 0) {
    auto [s, z] = observer_qparams(ex, l.output_observer);
    q.output = {true, s.at(0), z.at(0)};
  }
  return q;
}

}  // namespace

uint8_t nf4_code(float v) {
  if (std::isnan(v)) return 7;  // the code of 0.0
  uint8_t code = 0;
  for (int i = 0; i < 15; ++i) {
    float mid = (kNf4[i] + kNf4[i + 1]) * 0.5f;
    if (mid < v) code = static_cast<uint8_t>(i + 1);
  }
  return code;
}

float nf4_value(uint8_t code) {
  return kNf4[code & 0x0f];
}

std::pair<std::vector<float>, std::vector<int32_t>> observer_qparams(Executor& ex,
                                                                     NodeId observer) {
  // The observer alone, in a one-node graph holding the model's own state tensors: this works
  // whether or not a pass fused the observer into another node (its states are keyed by its
  // name either way), and eval mode reads the qparams without updating the statistics.
  const Graph& g = ex.graph();
  const Node& n = g.node(observer);
  QG_CHECK(n.outputs.size() == 2 && !n.states.empty(), "quantize", "node '", n.name,
           "' is not an observer");
  Graph one;
  std::vector<ValueId> inputs;
  Executor::Feeds feeds;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const TensorType& t = g.value(n.inputs[i]).type;
    const std::string name = "in" + std::to_string(i);
    inputs.push_back(one.input(name, t));
    feeds[name] = Tensor::zeros(t.shape, t.dtype);  // ignored in eval mode
  }
  std::vector<ValueId> qparams = one.apply(n.op->name, inputs, n.attrs, n.name);
  Executor solo(one, ex.device());
  share_states(ex, solo);
  solo.set_training(false);
  auto out = solo.run(feeds, qparams);
  Tensor s = out[0].to(Device::cpu()), z = out[1].to(Device::cpu());
  std::vector<float> scale(s.data<float>(), s.data<float>() + s.numel());
  std::vector<int32_t> zp(z.data<int32_t>(), z.data<int32_t>() + z.numel());
  return {scale, zp};
}

QuantizedMlp convert_to_quantized(Executor& ex, const std::vector<LinearLayer>& layers,
                                  NodeId input_observer, const QConfig& qconfig) {
  QG_CHECK((qconfig.weight == WeightQuant::none || qconfig.weight == WeightQuant::int8 ||
            qconfig.weight == WeightQuant::int4 || qconfig.weight == WeightQuant::nf4) &&
               qconfig.weight_scope != "group" && !qconfig.dynamic_weights &&
               (qconfig.activation == ActQuant::none || qconfig.activation == ActQuant::uint8),
           "quantize",
           "QuantizedMlp handles int8/int4/nf4 weights per channel or tensor and uint8 "
           "activations, not ",
           qconfig.str(), "; use nn/convert.h for other recipes");
  QuantizedMlp m;
  if (input_observer >= 0) {
    auto [s, z] = observer_qparams(ex, input_observer);
    m.input = {true, s.at(0), z.at(0)};
  }
  for (const auto& l : layers) m.layers.push_back(convert_layer(ex, l, qconfig));
  return m;
}

int64_t QuantizedMlp::size_bytes() const {
  int64_t bytes = input.enabled ? 8 : 0;
  for (const auto& l : layers) {
    bytes += static_cast<int64_t>(l.weight_f32.size() * 4 + l.codes8.size() + l.packed.size() +
                                  l.scales.size() * 4 + l.bias.size() * 4);
    bytes += l.output.enabled ? 8 : 0;
  }
  return bytes;
}

std::vector<float> QuantizedMlp::forward(const float* x, int64_t n) const {
  QG_CHECK(!layers.empty(), "quantized_mlp", "the model has no layers");
  std::vector<float> cur, next, wrow;
  std::vector<float> out;
  for (int64_t s = 0; s < n; ++s) {
    cur.assign(x + s * layers[0].in, x + (s + 1) * layers[0].in);
    for (float& v : cur) v = act_round_trip(v, input);
    for (const auto& l : layers) {
      next.assign(static_cast<size_t>(l.out), 0.0f);
      wrow.resize(static_cast<size_t>(l.in));
      for (int64_t r = 0; r < l.out; ++r) {
        dequantize_row(l, r, wrow.data());
        float acc = 0.0f;
        for (int64_t c = 0; c < l.in; ++c) acc += cur[c] * wrow[c];
        float y = acc + l.bias[r];
        if (l.relu) y = y > 0.0f ? y : 0.0f;
        next[r] = act_round_trip(y, l.output);
      }
      cur.swap(next);
    }
    out.insert(out.end(), cur.begin(), cur.end());
  }
  return out;
}

}  // namespace qg::nn
