// Element math of quantize-to-storage and dequantize, shared verbatim by the CPU and CUDA
// kernels (SEMANTICS.md, "Quantize to integer storage / dequantize").
#pragma once

#include "ops/common/quant_math.h"

namespace qg::qstore {

struct Code {
  int32_t q;
  bool in_range;  // the unclamped code lay in [qmin, qmax]: the straight-through mask
};

// q = clamp(rint(x * inv) + zp, qmin, qmax); NaN -> zp (mask 0); +/-Inf -> the end codes
// (mask 0). Agrees with qmath::quantize_code, and adds the mask the backward needs.
template <typename M>
QG_HD Code quantize(M x, M inv_scale, M zp, M qmin, M qmax) {
  if (qmath::is_nan(x)) return {static_cast<int32_t>(zp), false};
  M q = qmath::round_even(x * inv_scale) + zp;
  return {static_cast<int32_t>(qmath::clamp(q, qmin, qmax)), (q >= qmin) && (q <= qmax)};
}

// x' = (q - zp) * scale: the subtraction is exact for 8-bit codes, then one rounding.
template <typename M>
QG_HD M dequantize(int32_t q, M scale, M zp) {
  return (static_cast<M>(q) - zp) * scale;
}

// Backward of quantize: dx = dy / scale where the code was in range, else 0.
template <typename M>
QG_HD M quantize_grad(M dy, M scale, bool in_range) {
  return in_range ? dy / scale : M(0);
}

}  // namespace qg::qstore
