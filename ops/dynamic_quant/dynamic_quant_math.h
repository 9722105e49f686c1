// Qparams of dynamic-range quantization from a scope's own finite range (SEMANTICS.md,
// "Dynamic-range quantize"), shared verbatim by the CPU and CUDA kernels. Computed in f32.
//   symmetric: scale = max|x| / qmax, zp = 0
//   affine:    range extended to include 0; scale = (max_pos - min_neg) / (qmax - qmin),
//              zp = clamp(qmin - rint(min_neg / scale), qmin, qmax)
// No eps floor (unlike the observers): a scope whose values are all zero (or that has no
// finite value) gets scale 1 and zp = clamp(0, qmin, qmax), so its codes are 0. A non-zero
// range so tiny that 1 / scale overflows is treated the same way (its values are 0 at any
// representable precision); an affine range wider than f32 can hold is reported by the
// caller (`overflow`).
#pragma once

#include "ops/common/quant_math.h"

namespace qg::dynq {

struct QParams {
  float scale;
  int32_t zero_point;
  bool overflow;  // affine: max_pos - min_neg is not finite in f32
};

QG_HD QParams qparams(float min_v, float max_v, bool any_finite, bool symmetric, int32_t qmin,
                      int32_t qmax) {
  const float fmin = static_cast<float>(qmin), fmax = static_cast<float>(qmax);
  const QParams unit = {1.0f, static_cast<int32_t>(qmath::clamp(0.0f, fmin, fmax)), false};
  float min_neg = any_finite && min_v < 0.0f ? min_v : 0.0f;
  float max_pos = any_finite && max_v > 0.0f ? max_v : 0.0f;
  if (min_neg == 0.0f && max_pos == 0.0f) return unit;
  float scale;
  float zp = 0.0f;
  if (symmetric) {
    float amax = -min_neg > max_pos ? -min_neg : max_pos;
    scale = amax / fmax;
  } else {
    scale = (max_pos - min_neg) / static_cast<float>(qmax - qmin);
    if (!qmath::is_finite(scale)) return {scale, 0, true};
  }
  if (!qmath::is_finite(1.0f / scale)) return unit;
  if (!symmetric) zp = qmath::clamp(fmin - qmath::round_even(min_neg / scale), fmin, fmax);
  return {scale, static_cast<int32_t>(zp), false};
}

}  // namespace qg::dynq
