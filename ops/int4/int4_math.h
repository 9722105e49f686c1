// Element math of INT4 group quantization (SEMANTICS.md, "INT4 (group-wise)"), shared by
// the CPU and CUDA kernels so both produce the same codes, scales and bytes.
//
// Both modes store a code c in [0, 15] and dequantize as (c - zp) * scale:
//   symmetric:  scale = absmax / 7, zp = 8  (c = clamp(rint(x * inv), -8, 7) + 8)
//   asymmetric: scale = (max' - min') / 15 over the range extended to include 0,
//               zp = clamp(rint(-min' * inv), 0, 15), c = clamp(rint(x * inv) + zp, 0, 15)
// Adding 8 after the clamp equals clamping rint(x * inv) + 8 to [0, 15], because both are
// exact integers in the math type, so one encode serves both modes.
#pragma once

#include <cstdint>

#include "ops/common/quant_math.h"

namespace qg::int4 {

template <typename M>
struct GroupParams {
  M scale;
  M inv_scale;
  M zero_point;
};

// A scale that is 0 (a group of zeros, or of non-finite values only) or whose reciprocal
// overflows (a range below ~1e-38 in f32) would turn codes into NaN; such groups get
// scale 1, as SEMANTICS prescribes for all-zero groups. Their codes are then rint(x) + zp,
// i.e. zp for every value of the group.
template <typename M>
QG_HD GroupParams<M> finish_params(M scale, M zero_point_from_min_neg, bool symmetric) {
  M inv = M(1) / scale;
  if (!(scale > M(0)) || !qmath::is_finite(inv)) {
    scale = M(1);
    inv = M(1);
  }
  M zp = symmetric ? M(8)
                   : qmath::clamp(qmath::round_even(zero_point_from_min_neg * inv), M(0), M(15));
  return {scale, inv, zp};
}

// absmax over the group's finite values.
template <typename M>
QG_HD GroupParams<M> symmetric_params(M absmax) {
  return finish_params(absmax / M(7), M(0), true);
}

// min and max over the group's finite values (+inf / -inf when there are none).
template <typename M>
QG_HD GroupParams<M> asymmetric_params(M min_v, M max_v) {
  M min_neg = min_v < M(0) ? min_v : M(0);
  M max_pos = max_v > M(0) ? max_v : M(0);
  return finish_params((max_pos - min_neg) / M(15), -min_neg, false);
}

// The 4-bit code of x. NaN maps to the zero point (it dequantizes to 0); +/-Inf clamp to
// the end codes.
template <typename M>
QG_HD uint8_t encode(M x, const GroupParams<M>& p) {
  if (qmath::is_nan(x)) return static_cast<uint8_t>(p.zero_point);
  M q = qmath::round_even(x * p.inv_scale) + p.zero_point;
  return static_cast<uint8_t>(qmath::clamp(q, M(0), M(15)));
}

template <typename M>
QG_HD M decode(uint8_t code, M scale, M zero_point) {
  return (static_cast<M>(code) - zero_point) * scale;
}

// Element k of the flat (C-order) code stream lives in byte k / 2. With low_first (the
// seed layout) the even element is the low nibble; high_first (bitsandbytes/torchao)
// swaps them. An odd count leaves the last byte's other nibble 0.
QG_HD int nibble_shift(int64_t k, bool high_first) {
  bool low = ((k & 1) == 0) != high_first;
  return low ? 0 : 4;
}

QG_HD uint8_t get_code(const uint8_t* packed, int64_t k, bool high_first) {
  return static_cast<uint8_t>((packed[k >> 1] >> nibble_shift(k, high_first)) & 0xF);
}

QG_HD int64_t packed_bytes(int64_t numel) {
  return (numel + 1) / 2;
}

}  // namespace qg::int4
