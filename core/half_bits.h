// f16 and bf16 <-> f32 on raw bits: the one definition of how the engine converts its
// 16-bit floats, shared by host and device code (the CUDA kernels' to_math / from_math in
// ops/common/cuda_common.cuh call it; the CPU kernels' Eigen::half / Eigen::bfloat16 convert
// exactly as the host path below, which tests/core/half_bits_test.cpp checks on every 16-bit
// pattern and on the f32 rounding cases).
//  * Narrowing rounds to nearest, ties to even: overflow gives +-Inf, values below half the
//    smallest f16 subnormal give +-0, -0 stays -0.
//  * A NaN narrows to the quiet NaN of its sign without payload: 0x7e00 / 0xfe00 (f16),
//    0x7fc0 / 0xffc0 (bf16), what Eigen writes on the CPU (CUDA's own intrinsics would write
//    0x7fff), so NaN outputs match bit for bit too.
//  * Widening is exact. A NaN keeps its sign on both sides; on the host it also keeps its
//    payload (shifted into the top of the f32 mantissa, as Eigen does), while the device's
//    f16 conversion returns the hardware's own NaN payload. The payloads of widened NaNs
//    therefore differ between the backends; 16-bit outputs narrow them to the quiet NaN
//    above, so those bits agree.
// The device paths are the hardware conversions (one instruction each) plus the NaN fix-ups;
// the host paths compute the same bits in integer arithmetic.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace qg::half_bits {

inline constexpr uint16_t kF16QuietNaN = 0x7e00;   // sign bit clear
inline constexpr uint16_t kBF16QuietNaN = 0x7fc0;  // sign bit clear
inline constexpr uint16_t kSign16 = 0x8000;

QG_HOST_DEVICE uint32_t f32_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

QG_HOST_DEVICE float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// The 16-bit sign of an f32 (0 or 0x8000).
QG_HOST_DEVICE uint32_t sign16_of(float v) {
  return (f32_bits(v) >> 16) & kSign16;
}

// The quiet NaN a NaN v narrows to.
QG_HOST_DEVICE uint16_t f16_nan_of(float v) {
  return static_cast<uint16_t>(kF16QuietNaN | sign16_of(v));
}
QG_HOST_DEVICE uint16_t bf16_nan_of(float v) {
  return static_cast<uint16_t>(kBF16QuietNaN | sign16_of(v));
}

QG_HOST_DEVICE float bf16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(__ushort_as_bfloat16(h));
#else
  return f32_from_bits(static_cast<uint32_t>(h) << 16);  // bf16 is the top half of an f32
#endif
}

QG_HOST_DEVICE float f16_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & kSign16) << 16;
#if defined(__CUDA_ARCH__)
  // The hardware conversion returns a NaN without its sign (an H100 gave 0x7e00 for every
  // negative f16 NaN passed through fake_quantize, where the CPU keeps it: 0xfe00). OR-ing
  // the f16 sign back in changes nothing for any other value, whose converted sign already
  // equals it.
  return __uint_as_float(__float_as_uint(__half2float(__ushort_as_half(h))) | sign);
#else
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));  // Inf/NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in f32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return f32_from_bits(sign | f32_bits(magnitude));
#endif
}

// Host: round away the low 16 bits, ties to even, by adding 0x7fff plus the lowest kept
// bit; a carry into the exponent is the correct rounding (up to +-Inf past the largest bf16).
QG_HOST_DEVICE uint16_t f32_to_bf16(float v) {
#if defined(__CUDA_ARCH__)
  if (v != v) return bf16_nan_of(v);
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  const uint32_t u = f32_bits(v);
  if (v != v) return bf16_nan_of(v);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

QG_HOST_DEVICE uint16_t f32_to_f16(float v) {
#if defined(__CUDA_ARCH__)
  if (v != v) return f16_nan_of(v);
  return __half_as_ushort(__float2half_rn(v));
#else
  if (v != v) return f16_nan_of(v);
  const uint32_t u = f32_bits(v);
  const uint32_t sign = (u >> 16) & kSign16, a = u & 0x7fffffffu;
  uint32_t r = 0;  // below 2^-25 (f32 subnormals included): rounds to zero
  if (a >= 0x477ff000u) {
    r = 0x7c00;  // 65520 and up round to Inf (65504's last bit is odd, so the tie rounds up)
  } else if (a >= 0x38800000u) {
    // Normal f16 (2^-14 and up): rebias the exponent by 127 - 15 and round away the low 13
    // mantissa bits, ties to even; a carry into the exponent is the correct rounding.
    const uint32_t t = a - 0x38000000u;
    r = (t + 0xfffu + ((t >> 13) & 1u)) >> 13;
  } else if (a >= 0x33000000u) {
    // Subnormal f16, 2^-25 <= |v| < 2^-14: the value in units of 2^-24 is the significand
    // (implicit bit included) shifted right by 126 - exponent, 14 to 24 bits, rounded to
    // nearest even.
    const uint32_t shift = 126u - (a >> 23);
    const uint32_t significand = (a & 0x7fffffu) | 0x800000u;
    const uint32_t dropped = significand & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    r = significand >> shift;
    if (dropped > half || (dropped == half && (r & 1u) != 0)) ++r;
  }
  return static_cast<uint16_t>(sign | r);
#endif
}

// The same conversions without a branch, for device loops where a branch per element would
// serialise the elements of a pack: the NaN encoding is selected after the conversion.
QG_HOST_DEVICE uint16_t f32_to_bf16_select(float v) {
#if defined(__CUDA_ARCH__)
  const uint16_t nan = bf16_nan_of(v);
  const uint16_t r = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  return v != v ? nan : r;
#else
  return f32_to_bf16(v);
#endif
}
QG_HOST_DEVICE uint16_t f32_to_f16_select(float v) {
#if defined(__CUDA_ARCH__)
  const uint16_t nan = f16_nan_of(v);
  const uint16_t r = __half_as_ushort(__float2half_rn(v));
  return v != v ? nan : r;
#else
  return f32_to_f16(v);
#endif
}

}  // namespace qg::half_bits
