// CUDA kernels for relu and relu_backward: the same element expressions as the CPU kernels
// (NaN propagates through relu; the backward passes dy where x > 0), so bit-identical.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"

namespace qg {
namespace {

using namespace cuda;

struct ReluF {
  template <typename M>
  __device__ M operator()(M v, M) const {
    return v > 0 ? v : (v != v ? v : M(0));
  }
};
struct ReluBackwardF {
  template <typename M>
  __device__ M operator()(M dy, M x) const {
    return x > 0 ? dy : M(0);
  }
};

template <typename F>
void map_cuda(KernelContext& ctx, const Tensor& a, const Tensor& b, F f) {
  Tensor& y = ctx.outputs[0];
  dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
    launch_map2<decltype(tag)>(ctx.op, a.raw_data(), b.raw_data(), y.raw_data(), y.numel(), f,
                               static_cast<cudaStream_t>(ctx.stream));
  });
}

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

void add_activation_cuda_kernels(OpRegistry& r) {
  r.get_mutable("relu").kernels.push_back({DeviceType::cuda, kFloatTypes, [](KernelContext& c) {
                                             map_cuda(c, c.inputs[0], c.inputs[0], ReluF{});
                                           }});
  r.get_mutable("relu_backward")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, [](KernelContext& c) {
                            map_cuda(c, c.inputs[0], c.inputs[1], ReluBackwardF{});
                          }});
}

}  // namespace qg
