// Element math of gelu and silu and their derivatives, shared verbatim by the CPU and CUDA
// kernels (the same operations in the same order). The transcendental functions are libm's
// on the CPU and CUDA's erff/tanhf/expf (erf/tanh/exp in f64) on the GPU, which differ by a
// few ulps: runtime/crosscheck.cpp compares these ops with a tolerance, not bit for bit.
// M is float (f32, f16, bf16 inputs) or double.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define QG_ACT_HD __host__ __device__ __forceinline__
#else
#define QG_ACT_HD inline
#endif

namespace qg::act {

QG_ACT_HD float erf_of(float v) {
  return erff(v);
}
QG_ACT_HD double erf_of(double v) {
  return erf(v);
}
QG_ACT_HD float tanh_of(float v) {
  return tanhf(v);
}
QG_ACT_HD double tanh_of(double v) {
  return tanh(v);
}
QG_ACT_HD float exp_of(float v) {
  return expf(v);
}
QG_ACT_HD double exp_of(double v) {
  return exp(v);
}

constexpr double kSqrtHalf = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kTanhCubic = 0.044715;

// gelu, erf form: 0.5 x (1 + erf(x / sqrt 2)).
template <typename M>
QG_ACT_HD M gelu_erf(M x) {
  return x * M(0.5) * (M(1) + erf_of(x * M(kSqrtHalf)));
}
// d/dx = Phi(x) + x phi(x), Phi the normal CDF and phi its density.
template <typename M>
QG_ACT_HD M gelu_erf_grad(M x) {
  const M cdf = M(0.5) * (M(1) + erf_of(x * M(kSqrtHalf)));
  const M pdf = exp_of(M(-0.5) * x * x) * M(kInvSqrt2Pi);
  return cdf + x * pdf;
}

// gelu, tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
template <typename M>
QG_ACT_HD M gelu_tanh(M x) {
  const M inner = M(kSqrt2OverPi) * (x + M(kTanhCubic) * x * x * x);
  return M(0.5) * x * (M(1) + tanh_of(inner));
}
// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2), t = tanh(inner).
template <typename M>
QG_ACT_HD M gelu_tanh_grad(M x) {
  const M x2 = x * x;
  const M t = tanh_of(M(kSqrt2OverPi) * (x + M(kTanhCubic) * x2 * x));
  const M inner_grad = M(kSqrt2OverPi) * (M(1) + M(3.0 * kTanhCubic) * x2);
  return M(0.5) * (M(1) + t) + M(0.5) * x * (M(1) - t * t) * inner_grad;
}

// silu: x * sigmoid(x) = x / (1 + exp(-x)).
template <typename M>
QG_ACT_HD M silu(M x) {
  return x / (M(1) + exp_of(-x));
}
// d/dx = s (1 + x (1 - s)), s = sigmoid(x).
template <typename M>
QG_ACT_HD M silu_grad(M x) {
  const M s = M(1) / (M(1) + exp_of(-x));
  return s * (M(1) + x * (M(1) - s));
}

}  // namespace qg::act
