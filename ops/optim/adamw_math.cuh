// The AdamW update of one element on the GPU, shared by the adamw kernel (adamw_cuda.cu) and
// the multi-tensor kernel (ops/fused/multi_tensor_adamw): the same expressions, in the same
// order, as the CPU kernel (optim_cpu.h adam_step; built with --fmad=false, so no contraction
// differs), so every instantiation gives the same bits.
#pragma once

#include <cstdint>

namespace qg::optim_cuda {

__device__ __forceinline__ bool adamw_usable(double lr, float scale) {
  return isfinite(lr) && lr >= 0.0 && isfinite(scale);
}

// The per-step scalars of one parameter, from the rate, the scale and its step counter
// (already advanced). Bias corrections in double, as torch computes them on the host.
template <typename T>
struct AdamWScalars {
  T step_size, bc2_sqrt, decay, wd, g_scale, b1, b2, omb1, omb2, eps;
  bool decay_param, decay_grad;
};

template <typename T>
__device__ __forceinline__ AdamWScalars<T> adamw_scalars(double rate, float scale, int64_t step,
                                                         double beta1, double beta2, double eps,
                                                         double weight_decay, bool decoupled) {
  const double t = static_cast<double>(step);
  AdamWScalars<T> s;
  s.step_size = static_cast<T>(rate / (1.0 - pow(beta1, t)));
  s.bc2_sqrt = static_cast<T>(sqrt(1.0 - pow(beta2, t)));
  s.decay = static_cast<T>(1.0 - rate * weight_decay);
  s.wd = static_cast<T>(weight_decay);
  s.g_scale = static_cast<T>(scale);
  s.b1 = static_cast<T>(beta1);
  s.b2 = static_cast<T>(beta2);
  s.omb1 = static_cast<T>(1.0 - beta1);
  s.omb2 = static_cast<T>(1.0 - beta2);
  s.eps = static_cast<T>(eps);
  s.decay_param = decoupled && weight_decay != 0.0;
  s.decay_grad = !decoupled && weight_decay != 0.0;
  return s;
}

// One element: p, m and v updated in place from the raw gradient.
template <typename T>
__device__ __forceinline__ void adamw_element(const AdamWScalars<T>& s, T& p, T grad, T& m, T& v) {
  T g = grad * s.g_scale;
  T pi = p;
  if (s.decay_grad) g = g + s.wd * pi;
  if (s.decay_param) pi = pi * s.decay;
  const T mi = s.b1 * m + s.omb1 * g;
  const T vi = s.b2 * v + s.omb2 * (g * g);
  m = mi;
  v = vi;
  const T denom = sqrt(vi) / s.bc2_sqrt + s.eps;
  p = pi - s.step_size * (mi / denom);
}

}  // namespace qg::optim_cuda
