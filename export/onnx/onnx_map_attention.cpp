// Mapper of causal_attention (ops/attention): grouped-query causal self-attention on
// q [N, H, T, hd] and k, v [N, KV, T, hd], spelled out in the order of qatgraph's CPU kernel
// (ops/attention/attention_cpu.cpp), which divides by the softmax sum after the product
// with v:
//   k, v    repeated to H heads: [N, KV, 1, T, hd] -> Expand [N, KV, H / KV, T, hd] ->
//           [N, H, T, hd] (query head h reads KV head h / (H / KV), transformers' repeat_kv)
//   s       = MatMul(q, k^T) * scale + mask   (scale: the attribute, else hd^-1/2, in f32;
//                                              mask: 0 on and below the diagonal, -inf above)
//   e       = Exp(s - ReduceMax(s))           (masked entries: exp(-inf) = 0)
//   context = MatMul(e, v) / ReduceSum(e)
// The runtimes sum the dot products and the row sums in their own orders, so the context
// agrees to float rounding, not bit for bit.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "export/onnx/onnx_context.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

void map_causal_attention(Context& ctx, const Node& n) {
  const Shape& qs = ctx.shape(n.inputs[0]);
  const Shape& ks = ctx.shape(n.inputs[1]);
  QG_CHECK(qs.size() == 4 && ks.size() == 4 && ks[1] > 0 && qs[1] % ks[1] == 0, kOp,
           "causal_attention '", n.name, "' needs q [N, H, T, hd] and k [N, KV, T, hd], got ",
           shape_str(qs), " and ", shape_str(ks));
  // bf16 (mixed precision): the kernel computes in f32 from the widened inputs and rounds
  // the output once, which Context does after this mapper.
  const DType dt = ctx.graph().value(n.inputs[0]).type.dtype;
  QG_CHECK(dt == DType::f32 || dt == DType::bf16, kOp, "causal_attention '", n.name,
           "' is exported for f32 and bf16, got ", dtype_name(dt));
  const int64_t heads = qs[1], t = qs[2], hd = qs[3], kv = ks[1], group = heads / kv;
  const std::string base = n.name;
  auto repeat = [&](ValueId v, const std::string& what) {
    std::string x = ctx.value(v);
    if (group == 1) return x;
    const std::string b = base + "." + what;
    x = ctx.node1("Reshape", {x, ctx.initializer_i64(b + ".unsqueeze.shape", {-1, kv, 1, t, hd})},
                  b + ".unsqueeze");
    x = ctx.node1("Expand", {x, ctx.initializer_i64(b + ".repeat.shape", {1, kv, group, t, hd})},
                  b + ".repeat");
    return ctx.node1("Reshape", {x, ctx.initializer_i64(b + ".repeated.shape", {-1, heads, t, hd})},
                     b + ".repeated");
  };
  const std::string q = ctx.value(n.inputs[0]);
  const std::string k = repeat(n.inputs[1], "k"), v = repeat(n.inputs[2], "v");
  const double scale =
      n.attrs.has("scale") ? n.attrs.get_real("scale") : 1.0 / std::sqrt(static_cast<double>(hd));
  // One mask for every layer.
  const std::string mask = ctx.shared("causal_mask " + std::to_string(t), [&] {
    std::vector<float> m(static_cast<size_t>(t * t), 0.0f);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = i + 1; j < t; ++j)
        m[static_cast<size_t>(i * t + j)] = -std::numeric_limits<float>::infinity();
    return ctx.initializer_f32("causal_mask", {t, t}, m);
  });
  const std::string kt =
      ctx.node1("Transpose", {k}, base + ".k_t", {attr_ints("perm", {0, 1, 3, 2})});
  std::string s = ctx.node1("MatMul", {q, kt}, base + ".scores");
  s = ctx.node1("Mul", {s, ctx.scalar_f32(base + ".scale", static_cast<float>(scale))},
                base + ".scaled");
  s = ctx.node1("Add", {s, mask}, base + ".masked");
  const std::string m = ctx.reduce("ReduceMax", s, {-1}, base + ".row_max");
  const std::string e =
      ctx.node1("Exp", {ctx.node1("Sub", {s, m}, base + ".shifted")}, base + ".exp");
  const std::string sum = ctx.reduce("ReduceSum", e, {-1}, base + ".row_sum");
  const std::string num = ctx.node1("MatMul", {e, v}, base + ".weighted");
  ctx.bind(n.outputs[0], ctx.node("Div", {num, sum}, {ctx.output_name(n)}));
}

}  // namespace

void add_attention_mapper(std::map<std::string, Mapper>& t) {
  t["causal_attention"] = map_causal_attention;
}

}  // namespace qg::onnx_export
