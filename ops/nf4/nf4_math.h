// Element math of NF4 (SEMANTICS.md, "NF4") and of the 8-bit blockwise double quantization
// of its absmax values, shared by the CPU and CUDA kernels so both agree bit for bit.
// Packing (two codes per byte, nibble order) is INT4's: see ops/int4/int4_math.h.
#pragma once

#include <cstdint>

#include "ops/common/quant_math.h"

namespace qg::nf4 {

// The 16 NormalFloat-4 values (identical to bitsandbytes'); code 7 is 0.0. A switch rather
// than a static array so the function compiles unchanged as CUDA device code.
QG_HD float table(int code) {
  switch (code) {
    case 0:
      return -1.0f;
    case 1:
      return -0.6961928009986877f;
    case 2:
      return -0.5250730514526367f;
    case 3:
      return -0.39491748809814453f;
    case 4:
      return -0.28444138169288635f;
    case 5:
      return -0.18477343022823334f;
    case 6:
      return -0.09105003625154495f;
    case 7:
      return 0.0f;
    case 8:
      return 0.07958029955625534f;
    case 9:
      return 0.16093020141124725f;
    case 10:
      return 0.24611230194568634f;
    case 11:
      return 0.33791524171829224f;
    case 12:
      return 0.44070982933044434f;
    case 13:
      return 0.5626170039176941f;
    case 14:
      return 0.7229568362236023f;
    default:
      return 1.0f;
  }
}

inline constexpr int kZeroCode = 7;

// Midpoint between codes i and i + 1, in the math type: (t[i] + t[i+1]) * 0.5.
template <typename M>
QG_HD M midpoint(int i) {
  return (static_cast<M>(table(i)) + static_cast<M>(table(i + 1))) * M(0.5);
}

// code = number of midpoints strictly below v = x * (1 / absmax), so a value exactly on a
// midpoint takes the lower code. NaN v (a NaN x, or 0 * inf in a group whose absmax is 0)
// takes the code of 0.0; +/-Inf take codes 15 / 0.
template <typename M>
QG_HD uint8_t encode(M x, M inv_absmax) {
  M v = x * inv_absmax;
  if (qmath::is_nan(v)) return kZeroCode;
  int code = 0;
  for (int i = 0; i < 15; ++i) code += midpoint<M>(i) < v ? 1 : 0;
  return static_cast<uint8_t>(code);
}

template <typename M>
QG_HD M decode(uint8_t code, M absmax) {
  return static_cast<M>(table(code)) * absmax;
}

// Double quantization: each block of `block_size` consecutive absmax values (flat order)
// is quantized affinely to 8 bits over the block's own [min, max]:
//   scale = (max - min) / 255   (1 when that is 0 or has no finite reciprocal)
//   code  = clamp(rint((a - min) * (1 / scale)), 0, 255)
//   a'    = code * scale + min
// min and max are order-independent, so CPU and GPU reductions agree exactly.
template <typename M>
struct BlockParams {
  M scale;
  M inv_scale;
  M min;
};

template <typename M>
QG_HD BlockParams<M> block_params(M min_v, M max_v) {
  M scale = (max_v - min_v) / M(255);
  M inv = M(1) / scale;
  if (!(scale > M(0)) || !qmath::is_finite(inv)) {
    scale = M(1);
    inv = M(1);
  }
  return {scale, inv, min_v};
}

template <typename M>
QG_HD uint8_t block_encode(M a, const BlockParams<M>& p) {
  M q = qmath::round_even((a - p.min) * p.inv_scale);
  return static_cast<uint8_t>(qmath::clamp(q, M(0), M(255)));
}

template <typename M>
QG_HD M block_decode(uint8_t code, M scale, M min_v) {
  return static_cast<M>(code) * scale + min_v;
}

}  // namespace qg::nf4
