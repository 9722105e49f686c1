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
// Written without early returns so compilers emit selects (min/max, blends) rather than
// branches that random data mispredicts; NaN fails both comparisons and is replaced last.
template <typename M>
QG_HD Code quantize(M x, M inv_scale, M zp, M qmin, M qmax) {
  M q = qmath::round_even(x * inv_scale) + zp;
  bool in_range = (q >= qmin) & (q <= qmax);
  M c = q < qmin ? qmin : q;
  c = c > qmax ? qmax : c;
  c = qmath::is_nan(c) ? zp : c;
  return {static_cast<int32_t>(c), in_range};
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
