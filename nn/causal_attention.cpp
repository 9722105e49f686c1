// Llama's grouped-query causal self-attention (transformers' LlamaAttention, eager path):
//   q, k, v = q_proj(x), k_proj(x), v_proj(x)          Linears without bias, "<name>.q_proj"
//                                                      [H*hd, D], k/v_proj [KV*hd, D]
//   split into heads [N, H or KV, T, hd]; rope on q and k at positions 0..T-1
//   k, v repeated to the H query heads (query head h reads KV head h / (H / KV))
//   p = softmax(q k^T * hd^-1/2 + mask)                mask [T, T]: 0 on and below the
//                                                      diagonal, -inf above (a constant)
//   o_proj(merge_heads(p v))                           "<name>.o_proj" [D, H*hd]
// composed from existing ops; the fused attention op replaces the middle part later. The
// projections carry the QConfig's quantizers like any Linear; scores and softmax stay float.
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::causal_self_attention(ValueId x, int64_t heads, int64_t kv_heads,
                                       double rope_theta, const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() == 3, "nn.causal_attention", "layer '", name,
           "' needs an [N, T, D] input, got ", g_.value(x).type.str());
  const int64_t n = xs[0], t = xs[1], d = xs[2];
  QG_CHECK(heads > 0 && kv_heads > 0 && d % heads == 0 && heads % kv_heads == 0,
           "nn.causal_attention", "layer '", name, "': heads = ", heads, " must divide D = ", d,
           " and be a multiple of kv_heads = ", kv_heads);
  const int64_t hd = d / heads, group = heads / kv_heads;
  QG_CHECK(hd % 2 == 0, "nn.causal_attention", "layer '", name, "': the head dim ", hd,
           " must be even for the rotary embedding");
  auto split = [&](ValueId v, int64_t count, const std::string& what) {
    ValueId r = g_.apply1("reshape", {v}, {{"shape", Shape{n, t, count, hd}}},
                          name + "." + what + ".split");
    return g_.apply1("permute", {r}, {{"perm", Shape{0, 2, 1, 3}}}, name + "." + what + ".heads");
  };
  // KV head j serves query heads j * group .. (j + 1) * group - 1 (transformers' repeat_kv).
  auto repeat = [&](ValueId v, const std::string& what) {
    if (group == 1) return v;
    ValueId r = g_.apply1("reshape", {v}, {{"shape", Shape{n, kv_heads, 1, t, hd}}},
                          name + "." + what + ".unsqueeze");
    r = g_.apply1("broadcast_to", {r}, {{"shape", Shape{n, kv_heads, group, t, hd}}},
                  name + "." + what + ".repeat");
    return g_.apply1("reshape", {r}, {{"shape", Shape{n, heads, t, hd}}},
                     name + "." + what + ".repeated");
  };
  ValueId q = split(linear(x, heads * hd, name + ".q_proj", false, true, false), heads, "q");
  ValueId k = split(linear(x, kv_heads * hd, name + ".k_proj", false, true, false), kv_heads, "k");
  ValueId v = split(linear(x, kv_heads * hd, name + ".v_proj", false, true, false), kv_heads, "v");
  q = rotary(q, name + ".q.rope", rope_theta);
  k = repeat(rotary(k, name + ".k.rope", rope_theta), "k");
  v = repeat(v, "v");
  ValueId scores = g_.apply1("batched_matmul", {q, k}, {{"transpose_b", true}}, name + ".scores");
  ValueId scale = g_.constant(Tensor::scalar(1.0 / std::sqrt(static_cast<double>(hd)), DType::f32),
                              name + ".scale");
  scores = g_.apply1("mul", {scores, scale}, {}, name + ".scaled");
  std::vector<float> mask(static_cast<size_t>(t * t), 0.0f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j)
      mask[static_cast<size_t>(i * t + j)] = -std::numeric_limits<float>::infinity();
  ValueId causal = g_.constant(Tensor::from_vector<float>({t, t}, mask), name + ".causal_mask");
  scores = g_.apply1("add", {scores, causal}, {}, name + ".masked");
  ValueId p = g_.apply1("softmax", {scores}, {{"axis", -1}}, name + ".softmax");
  ValueId ctx = g_.apply1("batched_matmul", {p, v}, {}, name + ".context");
  ctx = g_.apply1("permute", {ctx}, {{"perm", Shape{0, 2, 1, 3}}}, name + ".merge");
  ctx = g_.apply1("reshape", {ctx}, {{"shape", Shape{n, t, heads * hd}}}, name + ".concat");
  ctx = act(ctx, name + ".context.out");
  return linear(ctx, d, name + ".o_proj", false, true, false);
}

}  // namespace qg::nn
