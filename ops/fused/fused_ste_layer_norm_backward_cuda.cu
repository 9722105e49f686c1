// CUDA kernel of fused_ste_layer_norm_backward: layer_norm_backward's kernels reading dy
// through the STE mask (see ops/norm/layer_norm_backward_cuda.cuh).
#include "ops/common/dispatch_f32_f64.h"
#include "ops/norm/layer_norm_backward_cuda.cuh"

namespace qg {

void add_fused_ste_layer_norm_backward_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_layer_norm_backward")
      .kernels.push_back({DeviceType::cuda, {DType::f32, DType::f64}, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs.at(0).dtype(), ctx.op, [&](auto tag) {
                              using T = decltype(tag);
                              norm_cuda::MaskedDy<T> dy{cuda::in_ptr<T>(ctx.inputs[0]),
                                                        cuda::in_ptr<uint8_t>(ctx.inputs[1])};
                              norm_cuda::layer_norm_backward_launch<T>(ctx, dy, 2);
                            });
                          }});
}

}  // namespace qg
