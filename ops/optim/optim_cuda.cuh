// The CUDA sgd and adam kernels, written once for the plain ops (ops/optim/optim_cuda.cu: the
// gradient is a tensor) and for the fused straight-through estimator + step
// (ops/fused/ste_optimizer/ste_optimizer_cuda.cu: the gradient is dy where the fake-quantizer's
// mask bit is set, else +0). `grad_at(i)` yields element i's gradient; every float operation after
// it is this one code (built with --fmad=false, so no contraction differs between the two
// instantiations), hence the fused node's update is bit-identical to ste_backward then the step.
#pragma once

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/optim/optim_args.h"

namespace qg::optim_cuda {

constexpr int kThreads = 256;

inline int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1024 ? (b < 1 ? 1 : b) : 1024);
}

static __global__ void advance_step(int64_t* step) {
  ++*step;
}

template <typename T, typename GradAt>
__global__ void sgd_kernel(T* p, GradAt grad_at, T* buf, const int64_t* step, int64_t n, T lr,
                           T mom, T one_minus_damp, T wd, bool nesterov) {
  const bool first = *step == 0;
  for (int64_t i = cuda::global_thread(); i < n; i += cuda::global_stride()) {
    T gi = grad_at(i);
    T pi = p[i];
    if (wd != T(0)) gi = gi + wd * pi;
    if (mom != T(0)) {
      buf[i] = first ? gi : mom * buf[i] + one_minus_damp * gi;
      gi = nesterov ? gi + mom * buf[i] : buf[i];
    }
    p[i] = pi - lr * gi;
  }
}

// Advances the step counter and forms the bias-corrected scalars {step_size, sqrt(1 - b2^t)}
// once, in double as torch forms them on the host, rounded to T. (Each thread of the update
// used to form them itself: two double-precision pow calls per thread, for a few elements.)
template <typename T>
__global__ void advance_adam(int64_t* step, double lr, double beta1, double beta2, T* scalars) {
  const double t = static_cast<double>(++*step);
  scalars[0] = static_cast<T>(lr / (1.0 - pow(beta1, t)));
  scalars[1] = static_cast<T>(sqrt(1.0 - pow(beta2, t)));
}

// One element of torch.optim.Adam (L2 weight decay into the gradient), updated in place: the
// expressions of the CPU kernel (optim_cpu.h adam_step) in its order. Shared by the adam
// kernel below and the multi-tensor one (ops/fused/multi_tensor_adam).
template <typename T>
__device__ __forceinline__ void adam_element(T& p, T g, T& m, T& v, T step_size, T bc2_sqrt, T b1,
                                             T b2, T omb1, T omb2, T eps, T wd) {
  if (wd != T(0)) g = g + wd * p;
  m = b1 * m + omb1 * g;
  v = b2 * v + omb2 * (g * g);
  T denom = sqrt(v) / bc2_sqrt + eps;
  p = p - step_size * (m / denom);
}

// Elements a thread updates per pass of its grid-stride loop: their loads are issued together.
constexpr int kAdamUnroll = 4;

template <typename T, typename GradAt>
__global__ void adam_kernel(T* __restrict__ p, GradAt grad_at, T* __restrict__ m, T* __restrict__ v,
                            const T* __restrict__ scalars, int64_t n, T b1, T b2, T omb1, T omb2,
                            T eps, T wd) {
  const T step_size = scalars[0];
  const T bc2_sqrt = scalars[1];
  const int64_t stride = cuda::global_stride();
  for (int64_t base = cuda::global_thread(); base < n; base += kAdamUnroll * stride) {
    T gi[kAdamUnroll], pi[kAdamUnroll], mi[kAdamUnroll], vi[kAdamUnroll];
#pragma unroll
    for (int u = 0; u < kAdamUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < n) {
        gi[u] = grad_at(i);
        pi[u] = p[i];
        mi[u] = m[i];
        vi[u] = v[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kAdamUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i >= n) continue;
      adam_element(pi[u], gi[u], mi[u], vi[u], step_size, bc2_sqrt, b1, b2, omb1, omb2, eps, wd);
      m[i] = mi[u];
      v[i] = vi[u];
      p[i] = pi[u];
    }
  }
}

// One sgd step of the parameter ctx.inputs[0] with `a` (an sgd node's parsed arguments) and
// states {momentum_buffer, step}: the update, then the step counter, on the node's stream.
template <typename T, typename GradAt>
void launch_sgd(KernelContext& ctx, const SgdArgs& a, GradAt grad_at) {
  auto stream = cuda_stream(ctx.device);
  int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[1].data<int64_t>();
  sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), grad_at, ctx.states[0].data<T>(), step, n, static_cast<T>(a.lr),
      static_cast<T>(a.momentum), static_cast<T>(1.0 - a.dampening), static_cast<T>(a.weight_decay),
      a.nesterov);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  advance_step<<<1, 1, 0, stream>>>(step);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

// One adam step with `a` (an adam node's parsed arguments) and states {exp_avg, exp_avg_sq, step}:
// the step counter and the scalars first (the update reads them), then the update.
template <typename T, typename GradAt>
void launch_adam(KernelContext& ctx, const AdamArgs& a, GradAt grad_at) {
  auto stream = cuda_stream(ctx.device);
  int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[2].data<int64_t>();
  Tensor scalars = Tensor::empty({2}, DTypeOf<T>::value, ctx.inputs[0].device());
  advance_adam<T><<<1, 1, 0, stream>>>(step, a.lr, a.beta1, a.beta2, scalars.data<T>());
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const double beta1 = a.beta1, beta2 = a.beta2;
  adam_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), grad_at, ctx.states[0].data<T>(), ctx.states[1].data<T>(),
      scalars.data<T>(), n, static_cast<T>(beta1), static_cast<T>(beta2),
      static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2), static_cast<T>(a.eps),
      static_cast<T>(a.weight_decay));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace qg::optim_cuda
