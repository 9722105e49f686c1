// Per-element observer math shared by the CPU kernels and any CUDA port (QG_HD), so both
// backends update statistics and pick bins with the same f32/f64 operations in the same
// order. Free of the standard library beyond <cmath>, like ops/common/quant_math.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/quant_math.h"

namespace qg::obsmath {

// Moving-average update in f32, in PyTorch's expression order `r + c * (cur - r)` (two
// roundings: the product, then the sum; no FMA).
QG_HD float moving_average(float running, float current, float c) {
  float diff = current - running;
  float step = c * diff;
  return running + step;
}

// min/max that are independent of the visiting order even for signed zeros: -0 wins the
// min and +0 the max (std::min keeps whichever zero came first).
QG_HD float ordered_min(float a, float b) {
  return (b < a || (b == a && (copysignf(1.0f, b) < 0.0f))) ? b : a;
}
QG_HD float ordered_max(float a, float b) {
  return (b > a || (b == a && !(copysignf(1.0f, b) < 0.0f))) ? b : a;
}

// torch.histc's bin for v over [lo, hi] with `bins` bins, all in f32:
// pos = int((v - lo) * bins / (hi - lo)), the top edge falling into the last bin.
// Returns -1 for values outside [lo, hi].
QG_HD int64_t histc_bin(float v, float lo, float hi, int64_t bins) {
  if (!(v >= lo && v <= hi)) return -1;
  float num = (v - lo) * static_cast<float>(bins);
  float f = num / (hi - lo);
  // Guards before the integer conversion: an overflowing span gives inf/inf = NaN.
  if (!(f < static_cast<float>(bins))) return bins - 1;
  if (!(f >= 0.0f)) return 0;
  return static_cast<int64_t>(f);
}

// Python's float floor division `a // b` (what torch.div(..., rounding_mode='floor') does
// for floating tensors): exact through fmod, then corrected towards -inf.
QG_HD float floor_div(float a, float b) {
  if (b == 0.0f) return a / b;
  float mod = fmodf(a, b);
  float div = (a - mod) / b;
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  if (div == 0.0f) return copysignf(0.0f, a / b);
  float fl = floorf(div);
  if (div - fl > 0.5f) fl += 1.0f;
  return fl;
}

// Percentile observer bins: f64 edges `lo + k * width`, k = floor((v - lo) / width),
// clamped into [0, bins - 1] (the top edge belongs to the last bin).
QG_HD int64_t percentile_bin(double v, double lo, double width, int64_t bins) {
  double k = floor((v - lo) / width);
  if (k < 0.0) return 0;
  if (k >= static_cast<double>(bins)) return bins - 1;
  return static_cast<int64_t>(k);
}

}  // namespace qg::obsmath
