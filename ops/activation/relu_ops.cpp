// relu and its backward (dx = dy where x > 0), the latter a plain graph op so both
// backends and the fusion pass see it.
#include "core/graph.h"
#include "ops/common/cpu_loops.h"
#include "ops/common/schema_helpers.h"

namespace qg {

void define_gelu_ops(OpRegistry& r);  // gelu_ops.cpp
void define_silu_ops(OpRegistry& r);  // silu_ops.cpp

void add_activation_cuda_kernels(OpRegistry& r);  // activation_cuda.cu
void add_activation_crosscheck(OpRegistry& r);    // activation_crosscheck.cpp

void define_activation_ops(OpRegistry& r) {
  OpDef& relu = r.define("relu");
  relu.doc = "y = max(x, 0); NaN propagates.";
  relu.inputs = {"x"};
  relu.outputs = {"y"};
  relu.differentiable_inputs = {true};
  relu.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return same_as_input(ctx);
  };
  relu.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                            cpu::unary_float("relu", ctx.inputs[0], ctx.outputs[0], [](auto v) {
                              return v > 0 ? v : (v != v ? v : decltype(v)(0));
                            });
                          }});
  relu.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("relu_backward", {c.grad_or_zeros(0), c.node.inputs[0]})};
  };
  relu.gradcheck_samples = [] {
    // Points are kept away from the kink at 0, where the derivative is undefined.
    GradcheckSample s{"[4,5]", {{{4, 5}}}, {}};
    s.inputs[0].values = {-0.9, -0.5, -0.3, 0.2,  0.7, 1.1,  -1.3, 0.4,   0.05, -0.05,
                          0.8,  -0.8, 0.6,  -0.6, 1.5, -1.5, 0.33, -0.33, 0.9,  -0.1};
    return std::vector<GradcheckSample>{s};
  };

  OpDef& back = r.define("relu_backward");
  back.doc = "dx = dy where x > 0, else 0.";
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
                                "relu_backward", ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                                [](auto dy, auto x) { return x > 0 ? dy : decltype(dy)(0); });
                          }});

  define_gelu_ops(r);
  define_silu_ops(r);
#ifdef QG_WITH_CUDA
  add_activation_cuda_kernels(r);
#endif
  add_activation_crosscheck(r);
}

}  // namespace qg
