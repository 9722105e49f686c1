// channel_div: the output rescaling of a folded conv-bn (nn/conv_bn.cpp), y = x / s[c] over
// axis 1, as one op so that its backward is one pass instead of four.
//   channel_div           {x [N, C, ...], s [C]} -> {y}
//   channel_div_backward  {dy, y, s} -> {dx = dy / s[c], ds[c] = -sum(dx * y)}
// torch.ao's ConvBn2d divides by scale_factor.reshape(1, -1, 1, 1) with broadcasting; the
// same IEEE division gives the same bits. Its gradient through a generic broadcast div is
// dy / s, (dy / s) * y and a sum over N, H, W: three passes over the activation and two
// temporaries of its size. The backward op computes dx and the per-channel sum in one pass
// with the same per-element rounding (dx and dx * y rounded in the tensor's dtype, the sum in
// f64, then negated), so on the CPU it gives the bits the generic chain gave; on the GPU
// the sum runs in another order (crosscheck tolerance, as batch_norm_backward's).
#include "core/error.h"
#include "core/graph.h"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/common/schema_helpers.h"
#include "ops/norm/norm_cpu.h"

namespace qg {
namespace {

// x [N, C, ...] (rank >= 2) and s [C] of x's dtype.
void expect_channel_vector(const InferContext& ctx, int x_input, int s_input) {
  const TensorType& x = ctx.inputs[x_input];
  QG_CHECK(x.shape.size() >= 2, ctx.op, "x must be [N, C, ...] (rank >= 2, channels on axis 1),",
           " got ", x.str());
  expect_same_dtype(ctx, x_input, s_input);
  QG_CHECK(ctx.inputs[s_input].shape == Shape{x.shape[1]}, ctx.op, "s must be [", x.shape[1],
           "] (one divisor per channel of axis 1), got ", ctx.inputs[s_input].str(), " for x ",
           x.str());
}

template <typename T>
void channel_div_typed(KernelContext& ctx) {
  const norm::ChannelLayout l = norm::channel_layout(ctx.inputs[0].shape());
  const T* x = ctx.inputs[0].data<T>();
  const T* s = ctx.inputs[1].data<T>();
  T* y = ctx.outputs[0].data<T>();
  for (int64_t b = 0; b < l.n; ++b)
    for (int64_t ch = 0; ch < l.c; ++ch) {
      const int64_t base = (b * l.c + ch) * l.s;
      for (int64_t i = 0; i < l.s; ++i) y[base + i] = x[base + i] / s[ch];
    }
}

template <typename T>
void channel_div_backward_typed(KernelContext& ctx) {
  const norm::ChannelLayout l = norm::channel_layout(ctx.inputs[0].shape());
  const T* dy = ctx.inputs[0].data<T>();
  const T* y = ctx.inputs[1].data<T>();
  const T* s = ctx.inputs[2].data<T>();
  T* dx = ctx.outputs[0].data<T>();
  T* ds = ctx.outputs[1].data<T>();
  for (int64_t ch = 0; ch < l.c; ++ch) {
    double sum = 0;  // image-major, as the generic sum_to walked it
    for (int64_t b = 0; b < l.n; ++b) {
      const int64_t base = (b * l.c + ch) * l.s;
      for (int64_t i = 0; i < l.s; ++i) {
        const T g = dy[base + i] / s[ch];
        dx[base + i] = g;
        sum += static_cast<double>(static_cast<T>(g * y[base + i]));
      }
    }
    ds[ch] = -static_cast<T>(sum);
  }
}

}  // namespace

void define_channel_div_ops(OpRegistry& r) {
  OpDef& op = r.define("channel_div");
  op.doc = "y = x / s[c] along axis 1 (a folded conv-bn's output rescaling).";
  op.inputs = {"x", "s"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true, true};
  op.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    expect_channel_vector(ctx, 0, 1);
    return std::vector<TensorType>{ctx.inputs[0]};
  };
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                          dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
                            channel_div_typed<decltype(tag)>(ctx);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    auto g = c.graph.apply("channel_div_backward", {c.grad_or_zeros(0), n.outputs[0], n.inputs[1]});
    return {c.needs_input_grad[0] ? g[0] : kNoValue, c.needs_input_grad[1] ? g[1] : kNoValue};
  };
  op.gradcheck_samples = [] {
    // Divisors of both signs, kept away from 0 so central differences stay well conditioned.
    return std::vector<GradcheckSample>{
        {"[3,2,2,3]", {{{3, 2, 2, 3}}, {{2}, DType::f64, 0.5, 2.0}}, {}},
        {"[4,3]", {{{4, 3}}, {{3}, DType::f64, -2.0, -0.5}}, {}}};
  };

  OpDef& back = r.define("channel_div_backward");
  back.doc = "dx = dy / s[c] and ds[c] = -sum(dx * y) of channel_div, in one pass.";
  back.inputs = {"dy", "y", "s"};
  back.outputs = {"dx", "ds"};
  back.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    QG_CHECK(ctx.inputs[0] == ctx.inputs[1], ctx.op, "dy ", ctx.inputs[0].str(), " must match y ",
             ctx.inputs[1].str());
    expect_channel_vector(ctx, 1, 2);
    return std::vector<TensorType>{ctx.inputs[0], ctx.inputs[2]};
  };
  back.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
                              channel_div_backward_typed<decltype(tag)>(ctx);
                            });
                          }});
}

}  // namespace qg
