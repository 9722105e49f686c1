// CUDA kernels for sgd and adam: the same per-element expressions as the CPU kernels in
// optim_ops.cpp (hyper-parameters rounded once from double on the host). The step counter
// lives on the device, so a separate one-thread kernel advances it, ordered on the stream
// before (adam) or after (sgd) the update that reads it: no host synchronisation.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"

namespace qg {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1024 ? (b < 1 ? 1 : b) : 1024);
}

__global__ void advance_step(int64_t* step) {
  ++*step;
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, const int64_t* step, int64_t n, T lr, T mom,
                           T one_minus_damp, T wd, bool nesterov) {
  const bool first = *step == 0;
  for (int64_t i = cuda::global_thread(); i < n; i += cuda::global_stride()) {
    T gi = g[i];
    T pi = p[i];
    if (wd != T(0)) gi = gi + wd * pi;
    if (mom != T(0)) {
      buf[i] = first ? gi : mom * buf[i] + one_minus_damp * gi;
      gi = nesterov ? gi + mom * buf[i] : buf[i];
    }
    p[i] = pi - lr * gi;
  }
}

template <typename T>
__global__ void adam_kernel(T* p, const T* g, T* m, T* v, const int64_t* step, int64_t n, double lr,
                            double beta1, double beta2, T b1, T b2, T omb1, T omb2, T eps, T wd) {
  const double t = static_cast<double>(*step);
  const T step_size = static_cast<T>(lr / (1.0 - pow(beta1, t)));
  const T bc2_sqrt = static_cast<T>(sqrt(1.0 - pow(beta2, t)));
  for (int64_t i = cuda::global_thread(); i < n; i += cuda::global_stride()) {
    T gi = g[i];
    if (wd != T(0)) gi = gi + wd * p[i];
    m[i] = b1 * m[i] + omb1 * gi;
    v[i] = b2 * v[i] + omb2 * (gi * gi);
    T denom = sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * (m[i] / denom);
  }
}

template <typename T>
void sgd_cuda(KernelContext& ctx) {
  const Attrs& a = ctx.attrs;
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[1].data<int64_t>();
  sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), ctx.inputs[1].data<T>(), ctx.states[0].data<T>(), step, n,
      static_cast<T>(a.get_real("lr")), static_cast<T>(a.get_real("momentum")),
      static_cast<T>(1.0 - a.get_real("dampening")), static_cast<T>(a.get_real("weight_decay")),
      a.get_bool("nesterov"));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  advance_step<<<1, 1, 0, stream>>>(step);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void adam_cuda(KernelContext& ctx) {
  const Attrs& a = ctx.attrs;
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[2].data<int64_t>();
  advance_step<<<1, 1, 0, stream>>>(step);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const double beta1 = a.get_real("beta1"), beta2 = a.get_real("beta2");
  adam_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), ctx.inputs[1].data<T>(), ctx.states[0].data<T>(),
      ctx.states[1].data<T>(), step, n, a.get_real("lr"), beta1, beta2, static_cast<T>(beta1),
      static_cast<T>(beta2), static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2),
      static_cast<T>(a.get_real("eps")), static_cast<T>(a.get_real("weight_decay")));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_optim_cuda_kernels(OpRegistry& r) {
  r.get_mutable("sgd").kernels.push_back(
      {DeviceType::cuda, {DType::f32, DType::f64}, [](KernelContext& c) {
         if (c.inputs[0].dtype() == DType::f64)
           sgd_cuda<double>(c);
         else
           sgd_cuda<float>(c);
       }});
  r.get_mutable("adam").kernels.push_back(
      {DeviceType::cuda, {DType::f32, DType::f64}, [](KernelContext& c) {
         if (c.inputs[0].dtype() == DType::f64)
           adam_cuda<double>(c);
         else
           adam_cuda<float>(c);
       }});
}

}  // namespace qg
