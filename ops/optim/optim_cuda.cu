// CUDA kernels for sgd and adam: the same per-element expressions as the CPU kernels in
// optim_ops.cpp (hyper-parameters rounded once from double on the host). The step counter
// lives on the device, so a separate one-thread kernel advances it, ordered on the stream
// before (adam) or after (sgd) the update that reads it: no host synchronisation. The kernels
// themselves are in optim_cuda.cuh, shared with the fused ste + optimizer op.
#include <type_traits>

#include "ops/optim/optim_cuda.cuh"

namespace qg {
namespace {

// The plain ops' gradient: a tensor, read element by element; a bf16/f16 gradient of an f32
// parameter widens exactly, as the cast kernel widens it.
template <typename T, typename G>
struct TensorGrad {
  const G* g;
  __device__ T operator()(int64_t i) const { return static_cast<T>(cuda::to_math(g[i])); }
};

// Calls fn(G{}) with G the gradient's element type: T's, or bf16/f16 under an f32 T (what
// the op's shape inference admits).
template <typename T, typename Fn>
void with_grad_type(const KernelContext& ctx, Fn&& fn) {
  const DType g = ctx.inputs[1].dtype();
  if constexpr (std::is_same_v<T, float>) {
    if (g == DType::bf16) return fn(__nv_bfloat16{});
    if (g == DType::f16) return fn(__half{});
  }
  fn(T{});
}

template <typename T>
void sgd_cuda(KernelContext& ctx) {
  with_grad_type<T>(ctx, [&](auto gtag) {
    using G = decltype(gtag);
    optim_cuda::launch_sgd<T>(ctx, ctx.args<SgdArgs>(),
                              TensorGrad<T, G>{static_cast<const G*>(ctx.inputs[1].raw_data())});
  });
}

template <typename T>
void adam_cuda(KernelContext& ctx) {
  with_grad_type<T>(ctx, [&](auto gtag) {
    using G = decltype(gtag);
    optim_cuda::launch_adam<T>(ctx, ctx.args<AdamArgs>(),
                               TensorGrad<T, G>{static_cast<const G*>(ctx.inputs[1].raw_data())});
  });
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
