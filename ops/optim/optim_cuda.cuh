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

template <typename T, typename GradAt>
__global__ void adam_kernel(T* p, GradAt grad_at, T* m, T* v, const int64_t* step, int64_t n,
                            double lr, double beta1, double beta2, T b1, T b2, T omb1, T omb2,
                            T eps, T wd) {
  const double t = static_cast<double>(*step);
  const T step_size = static_cast<T>(lr / (1.0 - pow(beta1, t)));
  const T bc2_sqrt = static_cast<T>(sqrt(1.0 - pow(beta2, t)));
  for (int64_t i = cuda::global_thread(); i < n; i += cuda::global_stride()) {
    T gi = grad_at(i);
    if (wd != T(0)) gi = gi + wd * p[i];
    m[i] = b1 * m[i] + omb1 * gi;
    v[i] = b2 * v[i] + omb2 * (gi * gi);
    T denom = sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * (m[i] / denom);
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
// the step counter first (the update reads it), then the update.
template <typename T, typename GradAt>
void launch_adam(KernelContext& ctx, const AdamArgs& a, GradAt grad_at) {
  auto stream = cuda_stream(ctx.device);
  int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[2].data<int64_t>();
  advance_step<<<1, 1, 0, stream>>>(step);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const double beta1 = a.beta1, beta2 = a.beta2;
  adam_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), grad_at, ctx.states[0].data<T>(), ctx.states[1].data<T>(), step, n,
      a.lr, beta1, beta2, static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(1.0 - beta1),
      static_cast<T>(1.0 - beta2), static_cast<T>(a.eps), static_cast<T>(a.weight_decay));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace qg::optim_cuda
