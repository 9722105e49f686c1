// Mappers of the float ops (opset 17), one small function per qatgraph op kind. Each mirrors
// the op's arithmetic in the same order where ONNX allows it (gelu's erf form is spelled out:
// opset 17 has no Gelu), so differences from qatgraph are only those of the runtime's kernels
// (summation order, libm).
#include <cmath>

#include "core/error.h"
#include "export/onnx/onnx_context.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

bool is_op(const Context& ctx, ValueId v, const char* op) {
  return ctx.producer(v).op->name == op;
}

// Binds the node's first output to an op over the mapped inputs.
void simple(Context& ctx, const Node& n, const char* op, const AttrList& attrs = {}) {
  std::vector<std::string> in;
  for (ValueId v : n.inputs) in.push_back(ctx.value(v));
  ctx.bind(n.outputs[0], ctx.node(op, in, {ctx.output_name(n)}, attrs));
}

// Straight-through estimator sg(q) + (x - sg(x)) (nn/builder.cpp): q in the forward pass,
// since x - x is exactly 0 for finite x. Returns q, or kNoValue for any other add.
ValueId ste_source(const Context& ctx, const Node& add) {
  ValueId a = add.inputs[0], b = add.inputs[1];
  if (!is_op(ctx, a, "stop_gradient") || !is_op(ctx, b, "sub")) return kNoValue;
  const Node& sub = ctx.producer(b);
  if (!is_op(ctx, sub.inputs[1], "stop_gradient")) return kNoValue;
  if (ctx.producer(sub.inputs[1]).inputs[0] != sub.inputs[0]) return kNoValue;
  return ctx.producer(a).inputs[0];
}

// conv2d(x, w, b) -> Conv; `bias` overrides b (a folded batch norm's per-channel bias).
void emit_conv(Context& ctx, const Node& conv, const std::string& bias, ValueId out) {
  const Shape& w = ctx.shape(conv.inputs[1]);
  const auto pad = conv.attrs.get_ints("padding");
  AttrList a = {attr_ints("kernel_shape", {w[2], w[3]}),
                attr_ints("strides", conv.attrs.get_ints("stride")),
                attr_ints("pads", {pad[0], pad[1], pad[0], pad[1]}),
                attr_ints("dilations", conv.attrs.get_ints("dilation")),
                attr_int("group", conv.attrs.get_int("groups"))};
  std::string x = ctx.value(conv.inputs[0]), wq = ctx.value(conv.inputs[1]);
  ctx.bind(out, ctx.node("Conv", {x, wq, bias}, {ctx.fresh(ctx.base_name(out))}, a));
}

void emit_gemm(Context& ctx, const Node& mm, const std::vector<std::string>& extra, ValueId out) {
  QG_CHECK(ctx.shape(mm.inputs[0]).size() == 2 && ctx.shape(mm.inputs[1]).size() == 2, kOp,
           "matmul '", mm.name, "' is not a 2-D product");
  std::string a = ctx.value(mm.inputs[0]), b = ctx.value(mm.inputs[1]);
  std::vector<std::string> in = {a, b};
  in.insert(in.end(), extra.begin(), extra.end());
  ctx.bind(out, ctx.node("Gemm", in, {ctx.fresh(ctx.base_name(out))},
                         {attr_int("transA", mm.attrs.get_bool("transpose_a") ? 1 : 0),
                          attr_int("transB", mm.attrs.get_bool("transpose_b") ? 1 : 0)}));
}

bool all_zero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.at(i) != 0.0) return false;
  return true;
}

void map_add(Context& ctx, const Node& n) {
  ValueId q = ste_source(ctx, n);
  if (q != kNoValue) {
    ctx.bind(n.outputs[0], ctx.value(q));
    return;
  }
  ValueId a = n.inputs[0], b = n.inputs[1];
  if (ctx.depends_on_input(a) && !ctx.depends_on_input(b) && ctx.uses(a) == 1) {
    const Node& p = ctx.producer(a);
    const Shape& bs = ctx.shape(b);
    // Linear: matmul(x, W^T) + bias is one Gemm (bias [out]).
    // (Not for a bf16 product: it is rounded before the add.)
    if (p.op->name == "matmul" && bs.size() == 1 && bs[0] == ctx.shape(a).back() &&
        ctx.graph().value(a).type.dtype == DType::f32) {
      emit_gemm(ctx, p, {ctx.value(b)}, n.outputs[0]);
      return;
    }
    // Conv-bn folded by nn/convert.cpp: conv2d(x, W, 0) + bias[1, C, 1, 1] is one Conv.
    const int64_t c = ctx.shape(a).size() == 4 ? ctx.shape(a)[1] : -1;
    if (p.op->name == "conv2d" && bs == Shape{1, c, 1, 1} && !ctx.depends_on_input(p.inputs[2]) &&
        all_zero(ctx.leaf(p.inputs[2]))) {
      const Shape flat{c};
      emit_conv(ctx, p, ctx.initializer(ctx.base_name(b), ctx.leaf(b), &flat), n.outputs[0]);
      return;
    }
  }
  simple(ctx, n, "Add");
}

void map_sub(Context& ctx, const Node& n) {
  simple(ctx, n, "Sub");
}
void map_mul(Context& ctx, const Node& n) {
  simple(ctx, n, "Mul");
}
void map_div(Context& ctx, const Node& n) {
  simple(ctx, n, "Div");
}
void map_relu(Context& ctx, const Node& n) {
  simple(ctx, n, "Relu");
}

void map_stop_gradient(Context& ctx, const Node& n) {
  ctx.bind(n.outputs[0], ctx.value(n.inputs[0]));  // the identity in the forward pass
}

// gelu as ops/activation/activation_math.h computes it, step for step:
//   erf form:  (x * 0.5) * (1 + erf(x * (1 / sqrt 2)))
//   tanh form: (0.5 * x) * (1 + tanh(sqrt(2 / pi) * (x + ((0.044715 * x) * x) * x)))
void map_gelu(Context& ctx, const Node& n) {
  const std::string x = ctx.value(n.inputs[0]), base = ctx.base_name(n.outputs[0]);
  const std::string one = ctx.scalar_f32(base + ".one", 1.0f);
  const std::string half = ctx.scalar_f32(base + ".half", 0.5f);
  std::string s;
  if (n.attrs.get_string("approximate") == "none") {
    std::string t =
        ctx.node1("Mul", {x, ctx.scalar_f32(base + ".sqrt_half", static_cast<float>(M_SQRT1_2))},
                  base + ".scaled");
    s = ctx.node1("Add", {one, ctx.node1("Erf", {t}, base + ".erf")}, base + ".cdf2");
    std::string h = ctx.node1("Mul", {x, half}, base + ".half_x");
    ctx.bind(n.outputs[0], ctx.node("Mul", {h, s}, {ctx.output_name(n)}));
    return;
  }
  std::string c = ctx.node1("Mul", {ctx.scalar_f32(base + ".cubic", 0.044715f), x}, base + ".c1");
  c = ctx.node1("Mul", {c, x}, base + ".c2");
  c = ctx.node1("Mul", {c, x}, base + ".c3");
  std::string inner = ctx.node1(
      "Mul",
      {ctx.scalar_f32(base + ".sqrt_2_over_pi", static_cast<float>(std::sqrt(2.0 / M_PI))),
       ctx.node1("Add", {x, c}, base + ".poly")},
      base + ".inner");
  s = ctx.node1("Add", {one, ctx.node1("Tanh", {inner}, base + ".tanh")}, base + ".cdf2");
  std::string h = ctx.node1("Mul", {half, x}, base + ".half_x");
  ctx.bind(n.outputs[0], ctx.node("Mul", {h, s}, {ctx.output_name(n)}));
}

// The batch is dynamic in the export: every reshape of the nn/ models keeps the batch (or
// batch x tokens) on its leading axis, which becomes -1.
void map_reshape(Context& ctx, const Node& n) {
  Shape s = n.attrs.get_ints("shape");
  const Shape& in = ctx.shape(n.inputs[0]);
  QG_CHECK(!s.empty() && !in.empty() && s[0] % ctx.batch() == 0 && in[0] % ctx.batch() == 0, kOp,
           "reshape '", n.name, "' ", shape_str(in), " -> ", shape_str(s),
           " does not keep the batch (", ctx.batch(), ") on its leading axis");
  s[0] = -1;
  const std::string base = ctx.base_name(n.outputs[0]);
  ctx.bind(n.outputs[0],
           ctx.node("Reshape", {ctx.value(n.inputs[0]), ctx.initializer_i64(base + ".shape", s)},
                    {ctx.output_name(n)}));
}

void map_permute(Context& ctx, const Node& n) {
  simple(ctx, n, "Transpose", {attr_ints("perm", n.attrs.get_ints("perm"))});
}

std::vector<int64_t> swap_perm(int64_t rank, int64_t d0, int64_t d1) {
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[i] = i;
  d0 = d0 < 0 ? d0 + rank : d0;
  d1 = d1 < 0 ? d1 + rank : d1;
  std::swap(perm[d0], perm[d1]);
  return perm;
}

void map_transpose(Context& ctx, const Node& n) {
  const int64_t rank = static_cast<int64_t>(ctx.shape(n.inputs[0]).size());
  simple(ctx, n, "Transpose",
         {attr_ints("perm", swap_perm(rank, n.attrs.get_int("dim0"), n.attrs.get_int("dim1")))});
}

void map_matmul(Context& ctx, const Node& n) {
  emit_gemm(ctx, n, {}, n.outputs[0]);
}

void map_batched_matmul(Context& ctx, const Node& n) {
  std::vector<std::string> in;
  const char* flags[2] = {"transpose_a", "transpose_b"};
  for (int i = 0; i < 2; ++i) {
    std::string v = ctx.value(n.inputs[i]);
    if (n.attrs.get_bool(flags[i])) {
      const int64_t rank = static_cast<int64_t>(ctx.shape(n.inputs[i]).size());
      v = ctx.node1("Transpose", {v}, ctx.base_name(n.inputs[i]) + ".T",
                    {attr_ints("perm", swap_perm(rank, -1, -2))});
    }
    in.push_back(v);
  }
  ctx.bind(n.outputs[0], ctx.node("MatMul", in, {ctx.output_name(n)}));
}

void map_softmax(Context& ctx, const Node& n) {
  simple(ctx, n, "Softmax", {attr_int("axis", n.attrs.get_int("axis"))});
}

void map_mean(Context& ctx, const Node& n) {
  const auto axes = n.attrs.get_ints("axes");
  const bool keep = n.attrs.get_bool("keepdim");
  if (ctx.opset() >= 18) {  // axes became an input
    std::vector<std::string> in = {ctx.value(n.inputs[0])};
    if (!axes.empty())
      in.push_back(ctx.initializer_i64(ctx.base_name(n.outputs[0]) + ".axes", axes));
    ctx.bind(n.outputs[0], ctx.node("ReduceMean", in, {ctx.output_name(n)},
                                    {attr_int("keepdims", keep ? 1 : 0)}));
    return;
  }
  AttrList a = {attr_int("keepdims", keep ? 1 : 0)};
  if (!axes.empty()) a.push_back(attr_ints("axes", axes));
  simple(ctx, n, "ReduceMean", a);
}

void map_layer_norm(Context& ctx, const Node& n) {
  simple(
      ctx, n, "LayerNormalization",
      {attr_int("axis", -1), attr_float("epsilon", static_cast<float>(n.attrs.get_real("eps")))});
}

// Eval mode: running statistics (Context exports with the executor in eval mode).
void map_batch_norm(Context& ctx, const Node& n) {
  simple(ctx, n, "BatchNormalization",
         {attr_float("epsilon", static_cast<float>(n.attrs.get_real("eps"))),
          attr_float("momentum", static_cast<float>(1.0 - n.attrs.get_real("momentum")))});
}

void map_conv2d(Context& ctx, const Node& n) {
  emit_conv(ctx, n, ctx.value(n.inputs[2]), n.outputs[0]);
}

AttrList window(const Node& n) {
  const auto kernel = n.attrs.get_ints("kernel");
  const auto stride = n.attrs.has("stride") ? n.attrs.get_ints("stride") : kernel;
  const auto pad = n.attrs.get_ints("padding");
  return {attr_ints("kernel_shape", kernel), attr_ints("strides", stride),
          attr_ints("pads", {pad[0], pad[1], pad[0], pad[1]}),
          attr_int("ceil_mode", n.attrs.get_bool("ceil_mode") ? 1 : 0)};
}

void map_max_pool2d(Context& ctx, const Node& n) {
  AttrList a = window(n);
  a.push_back(attr_ints("dilations", n.attrs.get_ints("dilation")));
  simple(ctx, n, "MaxPool", a);
}

void map_avg_pool2d(Context& ctx, const Node& n) {
  AttrList a = window(n);
  a.push_back(attr_int("count_include_pad", n.attrs.get_bool("count_include_pad") ? 1 : 0));
  simple(ctx, n, "AveragePool", a);
}

// [N, C, H, W] -> [N, C]: GlobalAveragePool keeps the 1 x 1 spatial axes; Flatten drops them.
void map_global_avg_pool2d(Context& ctx, const Node& n) {
  const std::string base = ctx.base_name(n.outputs[0]);
  std::string p = ctx.node1("GlobalAveragePool", {ctx.value(n.inputs[0])}, base + ".nchw");
  ctx.bind(n.outputs[0], ctx.node("Flatten", {p}, {ctx.output_name(n)}, {attr_int("axis", 1)}));
}

// A bf16-mixed model's casts between its f32 stream and its bf16 GEMM operands: to bf16 is
// a rounding (Context::round_to), back to f32 is exact and emits nothing.
void map_cast(Context& ctx, const Node& n) {
  const DType from = ctx.graph().value(n.inputs[0]).type.dtype;
  const DType to = ctx.graph().value(n.outputs[0]).type.dtype;
  const std::string x = ctx.value(n.inputs[0]);
  const bool widen = (from == DType::bf16 && to == DType::f32) || from == to;
  QG_CHECK(widen || (from == DType::f32 && to == DType::bf16), kOp, "cast '", n.name, "' from ",
           dtype_name(from), " to ", dtype_name(to),
           " is not exported (only f32 <-> bf16, the casts of bf16 mixed precision)");
  ctx.bind(n.outputs[0], widen ? x : ctx.round_to(x, to, n.name, "cast '" + n.name + "'"));
}

void map_embedding(Context& ctx, const Node& n) {
  simple(ctx, n, "Gather", {attr_int("axis", 0)});
}

}  // namespace

void add_tensor_mappers(std::map<std::string, Mapper>& t) {
  t["add"] = map_add;
  t["sub"] = map_sub;
  t["mul"] = map_mul;
  t["div"] = map_div;
  t["relu"] = map_relu;
  t["gelu"] = map_gelu;
  t["stop_gradient"] = map_stop_gradient;
  t["reshape"] = map_reshape;
  t["permute"] = map_permute;
  t["transpose"] = map_transpose;
  t["matmul"] = map_matmul;
  t["batched_matmul"] = map_batched_matmul;
  t["softmax"] = map_softmax;
  t["mean"] = map_mean;
  t["layer_norm"] = map_layer_norm;
  t["batch_norm"] = map_batch_norm;
  t["conv2d"] = map_conv2d;
  t["max_pool2d"] = map_max_pool2d;
  t["avg_pool2d"] = map_avg_pool2d;
  t["global_avg_pool2d"] = map_global_avg_pool2d;
  t["embedding"] = map_embedding;
  t["cast"] = map_cast;
}

}  // namespace qg::onnx_export
