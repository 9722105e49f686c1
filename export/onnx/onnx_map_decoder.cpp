// Mappers of the Llama decoder's element-wise and per-row ops, spelled out in ONNX ops that
// repeat qatgraph's arithmetic step for step (f32 models):
//
// rms_norm (ops/rms_norm/rms_norm_math.h): the sum of squares in f64, as qatgraph sums it
// (the square of an f32 is exact in f64, so only the order of the f64 sum differs, far below
// the f32 rounding that follows), then in f32:
//   ss = ReduceSum(Cast<f64>(x)^2), rstd = 1 / Sqrt(Cast<f32>(ss / d) + eps),
//   y  = w * (x * rstd)
// Opset 21 has no RMSNormalization (opset 23), and that op's f32 statistics would round
// differently anyway.
//
// rope (ops/rope/rope_math.h): the cos and sin tables depend only on the positions (a
// constant of the graph) and rope_theta, so they are initializers computed by qatgraph's own
// functions; the rotation is exact in ONNX ops:
//   y = x * cos + concat(-x[half:], x[:half]) * sin
// (T(-x_{j+half} * s) = T(-(x_{j+half} * s)): the same products and sums as the kernel).
//
// silu (ops/activation/activation_math.h): x / (1 + exp(-x)), as written there.
//
// bf16 (a bf16-mixed model's q/k and MLP activations): rope rounds as its kernel does, the
// tables and each product and the sum to bf16 (Context::round_to); silu computes in f32 and
// is rounded once by Context. rms_norm reads the f32 residual stream and stays f32-only.
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/half_bits.h"
#include "export/onnx/onnx_context.h"
#include "ops/rope/rope_math.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

DType require_f32_or_bf16(const Context& ctx, const Node& n) {
  const DType t = ctx.graph().value(n.inputs[0]).type.dtype;
  QG_CHECK(t == DType::f32 || t == DType::bf16, kOp, n.op->name, " '", n.name, "' reads a ",
           dtype_name(t), " tensor; it is exported for f32 and bf16");
  return t;
}

void require_f32(const Context& ctx, const Node& n) {
  for (ValueId v : n.inputs) {
    const DType t = ctx.graph().value(v).type.dtype;
    QG_CHECK(t == DType::f32 || t == DType::i64, kOp, n.op->name, " '", n.name, "' reads a ",
             dtype_name(t),
             " tensor; the decoder ops are exported for f32 models (bf16-mixed is not supported)");
  }
}

void map_rms_norm(Context& ctx, const Node& n) {
  require_f32(ctx, n);
  const std::string base = n.name;
  const int64_t d = ctx.shape(n.inputs[0]).back();
  const std::string x = ctx.value(n.inputs[0]), w = ctx.value(n.inputs[1]);
  const std::string xd = ctx.cast(x, onnx::TensorProto_DataType_DOUBLE, base + ".x_f64");
  const std::string sq = ctx.node1("Mul", {xd, xd}, base + ".squares");
  const std::string ss = ctx.reduce("ReduceSum", sq, {-1}, base + ".sum_squares");
  const std::string mean =
      ctx.cast(ctx.node1("Div", {ss, ctx.scalar_f64(base + ".dim", static_cast<double>(d))},
                         base + ".mean_f64"),
               onnx::TensorProto_DataType_FLOAT, base + ".mean");
  const std::string eps =
      ctx.scalar_f32(base + ".eps", static_cast<float>(n.attrs.get_real("eps")));
  const std::string root =
      ctx.node1("Sqrt", {ctx.node1("Add", {mean, eps}, base + ".mean_eps")}, base + ".rms");
  const std::string rstd =
      ctx.node1("Div", {ctx.scalar_f32(base + ".one", 1.0f), root}, base + ".rstd");
  const std::string h = ctx.node1("Mul", {x, rstd}, base + ".normed");
  ctx.bind(n.outputs[0], ctx.node("Mul", {w, h}, {ctx.output_name(n)}));
}

void map_rope(Context& ctx, const Node& n) {
  const DType dt = require_f32_or_bf16(ctx, n);
  const Shape& xs = ctx.shape(n.inputs[0]);
  QG_CHECK(xs.size() == 4, kOp, "rope '", n.name, "' needs [batch, heads, seq, head_dim], got ",
           shape_str(xs));
  const int64_t seq = xs[2], dim = xs[3], half = dim / 2;
  const Tensor& pos = ctx.leaf(n.inputs[1]);
  QG_CHECK(pos.dim() == 2 && pos.size(0) == 1 && pos.size(1) == seq, kOp, "rope '", n.name,
           "': positions ", shape_str(pos.shape()),
           " are exported only as one row [1, seq] shared by the batch (the batch is dynamic)");
  QG_CHECK(half <= kRopeMaxHalf, kOp, "rope '", n.name, "': head_dim ", dim, " is too large");
  const double theta = n.attrs.get_real("rope_theta");
  char theta_text[32];
  std::snprintf(theta_text, sizeof theta_text, "%.17g", theta);
  std::string key =
      "rope " + std::string(theta_text) + " " + std::to_string(dim) + " " + dtype_name(dt) + ":";
  for (int64_t t = 0; t < seq; ++t) key += " " + std::to_string(static_cast<int64_t>(pos.at(t)));
  // The tables of one position range are the same for q and k of every layer: written once.
  const bool bf16 = dt == DType::bf16;  // the kernel's tables are in the input's dtype
  auto table = [&](bool cosine) {
    return ctx.shared(key + (cosine ? " cos" : " sin"), [&] {
      RopeLayout layout;
      layout.dim = dim;
      rope_math::fill_inv_freq(layout, theta);
      std::vector<float> v(static_cast<size_t>(seq * dim));
      for (int64_t t = 0; t < seq; ++t)
        for (int64_t j = 0; j < dim; ++j) {
          const float a =
              rope_math::angle_of(static_cast<int64_t>(pos.at(t)), layout.inv_freq[j % half]);
          const float c = cosine ? rope_math::cos_f32(a) : rope_math::sin_f32(a);
          v[static_cast<size_t>(t * dim + j)] =
              bf16 ? half_bits::bf16_to_f32(half_bits::f32_to_bf16(c)) : c;
        }
      return ctx.initializer_f32(cosine ? "rope.cos" : "rope.sin", {seq, dim}, v);
    });
  };
  const std::string base = n.name;
  const std::string c = table(true), s = table(false);
  const std::string x = ctx.value(n.inputs[0]);
  auto slice = [&](int64_t from, int64_t to, const std::string& what) {
    return ctx.node1("Slice",
                     {x, ctx.initializer_i64(base + "." + what + ".starts", {from}),
                      ctx.initializer_i64(base + "." + what + ".ends", {to}),
                      ctx.initializer_i64(base + "." + what + ".axes", {3})},
                     base + "." + what);
  };
  const std::string x1 = slice(0, half, "x1"), x2 = slice(half, dim, "x2");
  const std::string rotated = ctx.node1("Concat", {ctx.node1("Neg", {x2}, base + ".neg_x2"), x1},
                                        base + ".rotate_half", {attr_int("axis", 3)});
  std::string xc = ctx.node1("Mul", {x, c}, base + ".x_cos");
  std::string rs = ctx.node1("Mul", {rotated, s}, base + ".rotated_sin");
  if (bf16) {  // y = T(T(x1 * c) + T(-x2 * s)), as rope_op.cpp rounds it
    const std::string what = "rope '" + n.name + "'";
    xc = ctx.round_to(xc, dt, base + ".x_cos", what);
    rs = ctx.round_to(rs, dt, base + ".rotated_sin", what);
    ctx.bind(n.outputs[0], ctx.round_to(ctx.node1("Add", {xc, rs}, base + ".sum"), dt, base, what));
    return;
  }
  ctx.bind(n.outputs[0], ctx.node("Add", {xc, rs}, {ctx.output_name(n)}));
}

void map_silu(Context& ctx, const Node& n) {
  require_f32_or_bf16(ctx, n);
  const std::string base = ctx.base_name(n.outputs[0]);
  const std::string x = ctx.value(n.inputs[0]);
  const std::string e = ctx.node1("Exp", {ctx.node1("Neg", {x}, base + ".neg")}, base + ".exp");
  const std::string den =
      ctx.node1("Add", {ctx.scalar_f32(base + ".one", 1.0f), e}, base + ".denominator");
  ctx.bind(n.outputs[0], ctx.node("Div", {x, den}, {ctx.output_name(n)}));
}

}  // namespace

void add_decoder_mappers(std::map<std::string, Mapper>& t) {
  t["rms_norm"] = map_rms_norm;
  t["rope"] = map_rope;
  t["silu"] = map_silu;
  add_attention_mapper(t);
}

}  // namespace qg::onnx_export
