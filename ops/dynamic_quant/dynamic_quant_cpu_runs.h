// Contiguous-run loops of the CPU dynamic_range_quantize kernel: the finite range of a run
// and its s8/u8 codes under one set of qparams. The scalar templates are the reference (and
// the f64 path and the SIMD tails); the f32/bf16/f16 overloads use SSE4.1 where the build
// has it and give the same results bit for bit (tests/ops_dynamic_quant compares them).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "ops/common/quant_math.h"
#include "ops/quantize/quantize_math.h"

namespace qg::dynq_cpu {

// Extends [*lo, *hi] with the finite values of x[0, n). Start from (+inf, -inf); the range
// stays empty (lo > hi) when the run has no finite value.
template <typename T, typename M = math_t<T>>
void finite_range_scalar(const T* x, int64_t n, M* lo, M* hi) {
  M l = *lo, h = *hi;
  for (int64_t j = 0; j < n; ++j) {
    M v = static_cast<M>(x[j]);
    if (!qmath::is_finite(v)) continue;
    l = v < l ? v : l;
    h = v > h ? v : h;
  }
  *lo = l;
  *hi = h;
}

// q[j] = clamp(rint(x[j] * inv) + zp, qmin, qmax), NaN -> zp (qstore::quantize).
template <typename T, typename Q, typename M = math_t<T>>
void quantize_run_scalar(const T* x, int64_t n, M inv, M zp, M qmin, M qmax, Q* q) {
  for (int64_t j = 0; j < n; ++j)
    q[j] = static_cast<Q>(qstore::quantize<M>(static_cast<M>(x[j]), inv, zp, qmin, qmax).q);
}

// The SIMD versions. A zero bound may come out as -0 where the scalar loop keeps +0 (or the
// reverse: min/max of +-0 depend on the visiting order); dynq::qparams reads only whether a
// bound is < 0 or > 0, so the qparams and codes do not change.
void finite_range(const float* x, int64_t n, float* lo, float* hi);
void finite_range(const bf16* x, int64_t n, float* lo, float* hi);
void finite_range(const f16* x, int64_t n, float* lo, float* hi);
inline void finite_range(const double* x, int64_t n, double* lo, double* hi) {
  finite_range_scalar(x, n, lo, hi);
}

void quantize_run(const float* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  int8_t* q);
void quantize_run(const bf16* x, int64_t n, float inv, float zp, float qmin, float qmax, int8_t* q);
void quantize_run(const f16* x, int64_t n, float inv, float zp, float qmin, float qmax, int8_t* q);
void quantize_run(const float* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  uint8_t* q);
void quantize_run(const bf16* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  uint8_t* q);
void quantize_run(const f16* x, int64_t n, float inv, float zp, float qmin, float qmax, uint8_t* q);
template <typename Q>
void quantize_run(const double* x, int64_t n, double inv, double zp, double qmin, double qmax,
                  Q* q) {
  quantize_run_scalar(x, n, inv, zp, qmin, qmax, q);
}

}  // namespace qg::dynq_cpu
