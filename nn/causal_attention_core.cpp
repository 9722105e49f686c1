#include "nn/causal_attention_core.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId fused_causal_attention(Graph& g, ValueId q, ValueId k, ValueId v, const std::string& name) {
  return g.apply("causal_attention", {q, k, v}, {}, name + ".attention").at(0);
}

ValueId composed_causal_attention(Graph& g, ValueId q, ValueId k, ValueId v,
                                  const std::string& name) {
  const Shape qs = shape_of_value(g, q), ks = shape_of_value(g, k);
  QG_CHECK(qs.size() == 4 && ks.size() == 4 && ks[1] > 0 && qs[1] % ks[1] == 0,
           "nn.causal_attention", "'", name, "': q [N, H, T, hd] and k [N, KV, T, hd] with KV ",
           "dividing H, got q ", g.value(q).type.str(), " and k ", g.value(k).type.str());
  const int64_t n = qs[0], heads = qs[1], t = qs[2], hd = qs[3], kv_heads = ks[1];
  const int64_t group = heads / kv_heads;
  // KV head j serves query heads j * group .. (j + 1) * group - 1 (transformers' repeat_kv).
  auto repeat = [&](ValueId x, const std::string& what) {
    if (group == 1) return x;
    ValueId r = g.apply1("reshape", {x}, {{"shape", Shape{n, kv_heads, 1, t, hd}}},
                         name + "." + what + ".unsqueeze");
    r = g.apply1("broadcast_to", {r}, {{"shape", Shape{n, kv_heads, group, t, hd}}},
                 name + "." + what + ".repeat");
    return g.apply1("reshape", {r}, {{"shape", Shape{n, heads, t, hd}}},
                    name + "." + what + ".repeated");
  };
  k = repeat(k, "k");
  v = repeat(v, "v");
  ValueId scores = g.apply1("batched_matmul", {q, k}, {{"transpose_b", true}}, name + ".scores");
  ValueId scale = g.constant(Tensor::scalar(1.0 / std::sqrt(static_cast<double>(hd)), DType::f32),
                             name + ".scale");
  scores = g.apply1("mul", {scores, scale}, {}, name + ".scaled");
  std::vector<float> mask(static_cast<size_t>(t * t), 0.0f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j)
      mask[static_cast<size_t>(i * t + j)] = -std::numeric_limits<float>::infinity();
  ValueId causal = g.constant(Tensor::from_vector<float>({t, t}, mask), name + ".causal_mask");
  scores = g.apply1("add", {scores, causal}, {}, name + ".masked");
  ValueId p = g.apply1("softmax", {scores}, {{"axis", -1}}, name + ".softmax");
  return g.apply1("batched_matmul", {p, v}, {}, name + ".context");
}

}  // namespace qg::nn
