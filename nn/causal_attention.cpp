// Llama's grouped-query causal self-attention (transformers' LlamaAttention, eager path):
//   q, k, v = q_proj(x), k_proj(x), v_proj(x)          Linears without bias, "<name>.q_proj"
//                                                      [H*hd, D], k/v_proj [KV*hd, D]
//   split into heads [N, H or KV, T, hd]; rope on q and k at positions 0..T-1
//   softmax(q k^T * hd^-1/2 + causal mask) v           one causal_attention node; query head
//                                                      h reads KV head h / (H / KV)
//   o_proj(merge_heads(context))                       "<name>.o_proj" [D, H*hd]
// The middle is the fused op (nn/causal_attention_core.h, which also keeps the composed
// graph it is tested against). The projections carry the QConfig's quantizers like any
// Linear; the scores and the softmax stay float inside the fused op.
#include "core/error.h"
#include "nn/builder.h"
#include "nn/causal_attention_core.h"

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
  const int64_t hd = d / heads;
  QG_CHECK(hd % 2 == 0, "nn.causal_attention", "layer '", name, "': the head dim ", hd,
           " must be even for the rotary embedding");
  auto split = [&](ValueId v, int64_t count, const std::string& what) {
    ValueId r = g_.apply1("reshape", {v}, {{"shape", Shape{n, t, count, hd}}},
                          name + "." + what + ".split");
    return g_.apply1("permute", {r}, {{"perm", Shape{0, 2, 1, 3}}}, name + "." + what + ".heads");
  };
  ValueId q = split(linear(x, heads * hd, name + ".q_proj", false, true, false), heads, "q");
  ValueId k = split(linear(x, kv_heads * hd, name + ".k_proj", false, true, false), kv_heads, "k");
  ValueId v = split(linear(x, kv_heads * hd, name + ".v_proj", false, true, false), kv_heads, "v");
  q = rotary(q, name + ".q.rope", rope_theta);
  k = rotary(k, name + ".k.rope", rope_theta);
  ValueId ctx = fused_causal_attention(g_, q, k, v, name);
  ctx = g_.apply1("permute", {ctx}, {{"perm", Shape{0, 2, 1, 3}}}, name + ".merge");
  ctx = g_.apply1("reshape", {ctx}, {{"shape", Shape{n, t, heads * hd}}}, name + ".concat");
  ctx = act(ctx, name + ".context.out");
  return linear(ctx, d, name + ".o_proj", false, true, false);
}

}  // namespace qg::nn
