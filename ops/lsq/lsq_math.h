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

// One element's gradient terms before the grad_factor: dx, and its contributions to dscale
// and dzero_point, which are returned in f64 because the caller sums them in f64.
template <typename M>
struct ElementGrad {
  M dx;
  double dscale;
  double dzp;
};

// in range:  dx = dy, dscale = dy * (y - x) / scale, dzp = 0
// q < qmin:  dx = 0,  dscale = dy * (qmin - zp_int), dzp = -dy * scale
// q > qmax:  dx = 0,  dscale = dy * (qmax - zp_int), dzp = -dy * scale
// In range, (y - x) / scale = rint(v) - x / scale with v = x * inv_scale: evaluated as
// rint(v) - x * inv_scale in f64, where the product of two f32 values is exact. Rounding v
// first would lose |v| * 2^-24 to cancellation (1e-4 relative for a term of 0.1 at v = 200);
// this way the term is exact for f32 data, as PyTorch's contracted (FMA) evaluation nearly is.
// The classification still uses the f32 v, exactly as the forward does.
// NaN x has no defined q: it contributes nothing (a NaN would poison the whole reduction).
// Selects instead of early returns, so random data does not mispredict branches.
template <typename M>
QG_HD ElementGrad<M> element_grad(M x, M dy, M inv_scale, M scale, M zp_int, M qmin, M qmax) {
  M r = qmath::round_even(x * inv_scale);
  M q = r + zp_int;
  bool below = q<qmin, above = q> qmax, nan = qmath::is_nan(x);
  bool inside = !(below | above | nan);
  const double dyd = static_cast<double>(dy);
  double end = static_cast<double>(below ? qmin : qmax);
  double out_scale = dyd * (end - static_cast<double>(zp_int));
  double in_scale =
      dyd * (static_cast<double>(r) - static_cast<double>(x) * static_cast<double>(inv_scale));
  double out_zp = -dyd * static_cast<double>(scale);
  return {inside ? dy : M(0), inside ? in_scale : (nan ? 0.0 : out_scale),
          (inside | nan) ? 0.0 : out_zp};
}

// The forward value, identical to qmath::fake_quant(...).y (NaN stays the same NaN), written
// with selects for the same reason.
template <typename M>
QG_HD M forward(M x, M inv_scale, M scale, M zp_int, M qmin, M qmax) {
  M q = qmath::round_even(x * inv_scale) + zp_int;
  M c = q < qmin ? qmin : q;
  c = c > qmax ? qmax : c;
  M y = (c - zp_int) * scale;
  return qmath::is_nan(x) ? x : y;
}

}  // namespace qg::lsq
