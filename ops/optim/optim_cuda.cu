// CUDA kernels for sgd and adam: the same per-element expressions as the CPU kernels in
// optim_ops.cpp (hyper-parameters rounded once from double on the host). The step counter
// lives on the device, so a separate one-thread kernel advances it, ordered on the stream
// before (adam) or after (sgd) the update that reads it: no host synchronisation. The kernels
// themselves are in optim_cuda.cuh, shared with the fused ste + optimizer op.
#include "ops/optim/optim_cuda.cuh"

namespace qg {
namespace {

// The plain ops' gradient: a tensor, read element by element.
template <typename T>
struct TensorGrad {
  const T* g;
  __device__ T operator()(int64_t i) const { return g[i]; }
};

template <typename T>
void sgd_cuda(KernelContext& ctx) {
  optim_cuda::launch_sgd<T>(ctx, ctx.args<SgdArgs>(), TensorGrad<T>{ctx.inputs[1].data<T>()});
}

template <typename T>
void adam_cuda(KernelContext& ctx) {
  optim_cuda::launch_adam<T>(ctx, ctx.args<AdamArgs>(), TensorGrad<T>{ctx.inputs[1].data<T>()});
}

}  // namespace

void add_optim_cuda_kernels(OpRegistry& r) {
  r.get_mutable("sgd").kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& c) {
                                            if (c.inputs[0].dtype() == DType::f64)
                                              sgd_cuda<double>(c);
                                            else
                                              sgd_cuda<float>(c);
                                          }});
  r.get_mutable("adam").kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& c) {
                                             if (c.inputs[0].dtype() == DType::f64)
                                               adam_cuda<double>(c);
                                             else
                                               adam_cuda<float>(c);
                                           }});
}

}  // namespace qg
