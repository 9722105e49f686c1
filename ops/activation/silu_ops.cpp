// silu (x * sigmoid(x), PyTorch's F.silu) and silu_backward (dx = dy * silu'(x)). Element
// math in ops/activation/activation_math.h.
#include "core/graph.h"
#include "ops/activation/activation_math.h"
#include "ops/common/cpu_loops.h"
#include "ops/common/schema_helpers.h"

namespace qg {
void define_silu_ops(OpRegistry& r) {
  OpDef& silu = r.define("silu");
  silu.doc = "y = x * sigmoid(x) = x / (1 + exp(-x)).";
  silu.inputs = {"x"};
  silu.outputs = {"y"};
  silu.differentiable_inputs = {true};
  silu.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return same_as_input(ctx);
  };
  silu.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                            cpu::unary_float("silu", ctx.inputs[0], ctx.outputs[0],
                                             [](auto x) { return act::silu(x); });
                          }});
  silu.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("silu_backward", {c.grad_or_zeros(0), c.node.inputs[0]})};
  };
  silu.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        GradcheckSample{"[4,6]", {{{4, 6}, DType::f64, -6.0, 6.0}}, {}}};
  };

  OpDef& back = r.define("silu_backward");
  back.doc = "dx = dy * s (1 + x (1 - s)), s = sigmoid(x).";
  back.inputs = {"dy", "x"};
  back.outputs = {"dx"};
  back.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_same_dtype(ctx, 0, 1);
    QG_CHECK(ctx.inputs[0].shape == ctx.inputs[1].shape, ctx.op, "dy ", ctx.inputs[0].str(),
             " and x ", ctx.inputs[1].str(), " must have the same shape");
    return same_as_input(ctx);
  };
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                            cpu::binary_float(
                                "silu_backward", ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                                [](auto dy, auto x) { return dy * act::silu_grad(x); });
                          }});
}

}  // namespace qg
