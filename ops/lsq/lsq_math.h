// Element math of learnable fake quantization (LSQ / LSQ+), shared verbatim by the CPU and
// CUDA kernels. The forward is qmath::fake_quant with the rounded, clamped zero point; the
// backward terms below are summed (in f64) by the caller and scaled by grad_factor once, so
// every backend adds the same per-element values.
#pragma once

#include "ops/common/quant_math.h"

namespace qg::lsq {

// zp_int = clamp(rint(zp), qmin, qmax) (SEMANTICS.md, "Learnable fake quantize"). A learnable
// zero point drifts off the grid and out of range during training; both forward and backward
// use this integer value.
template <typename M>
QG_HD M zero_point_int(M zp, M qmin, M qmax) {
  return qmath::clamp(qmath::round_even(zp), qmin, qmax);
}

// One element's gradient terms before the grad_factor: dx, and the contributions to
// dscale and dzero_point.
template <typename M>
struct ElementGrad {
  M dx;
  M dscale;
  M dzp;
};

// in range:  dx = dy, dscale = dy * (y - x) / scale, dzp = 0
// q < qmin:  dx = 0,  dscale = dy * (qmin - zp_int), dzp = -dy * scale
// q > qmax:  dx = 0,  dscale = dy * (qmax - zp_int), dzp = -dy * scale
// NaN x has no defined q: it contributes nothing (a NaN would poison the whole reduction).
template <typename M>
QG_HD ElementGrad<M> element_grad(M x, M dy, M inv_scale, M scale, M zp_int, M qmin, M qmax) {
  if (qmath::is_nan(x)) return {M(0), M(0), M(0)};
  M q = qmath::round_even(x * inv_scale) + zp_int;
  if (q < qmin) return {M(0), dy * (qmin - zp_int), -dy * scale};
  if (q > qmax) return {M(0), dy * (qmax - zp_int), -dy * scale};
  M y = (q - zp_int) * scale;
  return {dy, dy * ((y - x) / scale), M(0)};
}

}  // namespace qg::lsq
