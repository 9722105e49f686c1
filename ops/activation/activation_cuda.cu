// CUDA kernels for relu and relu_backward: the same element expressions as the CPU kernels
// (NaN propagates through relu; the backward passes dy where x > 0), so bit-identical.
// gelu and silu (and their backward ops) evaluate ops/activation/activation_math.h, the CPU
// kernels' expressions, with CUDA's erff/tanhf/expf: within a few ulps of the CPU's libm.
#include "core/graph.h"
#include "ops/activation/activation_fwd.cuh"
#include "ops/activation/activation_grad.cuh"
#include "ops/activation/activation_math.h"
#include "ops/activation/gelu_args.h"
#include "ops/common/cuda_common.cuh"

namespace qg {
namespace {

using namespace cuda;

template <typename F>
void map_cuda(KernelContext& ctx, const Tensor& a, const Tensor& b, F f) {
  Tensor& y = ctx.outputs[0];
  dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
    launch_map2<decltype(tag)>(ctx.op, a.raw_data(), b.raw_data(), y.raw_data(), y.numel(), f,
                               cuda_stream(ctx.device));
  });
}

}  // namespace

void add_activation_cuda_kernels(OpRegistry& r) {
  r.get_mutable("relu").kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                                             map_cuda(c, c.inputs[0], c.inputs[0], ReluF{});
                                           }});
  r.get_mutable("relu_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                            map_cuda(c, c.inputs[0], c.inputs[1], ReluBackwardF{});
                          }});
  r.get_mutable("gelu").kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                                             if (c.args<GeluArgs>().tanh)
                                               map_cuda(c, c.inputs[0], c.inputs[0], GeluTanhF{});
                                             else
                                               map_cuda(c, c.inputs[0], c.inputs[0], GeluErfF{});
                                           }});
  r.get_mutable("gelu_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                            if (c.args<GeluArgs>().tanh)
                              map_cuda(c, c.inputs[0], c.inputs[1], GeluTanhBackwardF{});
                            else
                              map_cuda(c, c.inputs[0], c.inputs[1], GeluErfBackwardF{});
                          }});
  r.get_mutable("silu").kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                                             map_cuda(c, c.inputs[0], c.inputs[0], SiluF{});
                                           }});
  r.get_mutable("silu_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, [](KernelContext& c) {
                            map_cuda(c, c.inputs[0], c.inputs[1], SiluBackwardF{});
                          }});
}

}  // namespace qg
