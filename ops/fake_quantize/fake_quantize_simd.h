// SSE loops for the CPU fake_quantize and ste_backward kernels. Each lane does exactly what
// the scalar path does (qmath::fake_quant in f32, Eigen's round-to-nearest-even narrowing for
// f16/bf16, NaN written as Eigen's quiet NaN), so results are bit-identical to it; the
// kernels in fake_quantize_cpu.cpp pick these loops for runs of contiguous elements.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace qg::fq_simd {

// The f32 qparams of one run of elements (inv_scale = 1 / scale, computed once in f32).
struct RunQParams {
  float inv_scale, scale, zero_point, qmin, qmax;
};

// Fake-quantizes n contiguous elements that share one set of qparams. `first` is the flat
// index of x[0] in the tensor: mask bits first .. first + n - 1 are written (they must be 0
// on entry: partial mask bytes are OR-ed, whole ones stored); other bits are left alone.
void fake_quant_run(const float* x, float* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p);
void fake_quant_run(const bf16* x, bf16* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p);
void fake_quant_run(const f16* x, f16* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p);

// As fake_quant_run, with per-element qparams: element j uses inv_scale[j], scale[j] and
// zero_point[j] (per-channel on the last axis, per-group across a trailing dimension).
struct LaneQParams {
  const float *inv_scale, *scale, *zero_point;
  float qmin, qmax;
};
void fake_quant_lanes(const float* x, float* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p);
void fake_quant_lanes(const bf16* x, bf16* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p);
void fake_quant_lanes(const f16* x, f16* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p);

// dx[i] = mask bit i ? dy[i] : 0 for i < n (a bit copy, so NaN payloads survive).
void ste_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n);
void ste_backward(const double* dy, const uint8_t* mask, double* dx, int64_t n);
void ste_backward(const bf16* dy, const uint8_t* mask, bf16* dx, int64_t n);
void ste_backward(const f16* dy, const uint8_t* mask, f16* dx, int64_t n);

// ste_backward_exact: dx = dy * mask as a float multiply, PyTorch's STE. A masked-out element
// is dy * 0: a zero with dy's sign, NaN where dy is infinite or NaN.
void ste_backward_exact(const float* dy, const uint8_t* mask, float* dx, int64_t n);
void ste_backward_exact(const double* dy, const uint8_t* mask, double* dx, int64_t n);
void ste_backward_exact(const bf16* dy, const uint8_t* mask, bf16* dx, int64_t n);
void ste_backward_exact(const f16* dy, const uint8_t* mask, f16* dx, int64_t n);

}  // namespace qg::fq_simd
