// Per-element steps of the one-pass row / group kernels (dynamic_range_quantize's segment
// kernel, the INT4 group packer), written for few SASS instructions per element because
// those kernels are issue-bound, not byte-bound, once their loads are in flight:
//  - finite_or_nan in one FMA (the range reduction ignores NaN), and for 16-bit types on
//    two elements at once (HFMA2 / HMNMX2 on bf16x2 / f16x2 words);
//  - the integer code clamp(rint(y) + zp, qmin, qmax), NaN -> zp, in three instructions
//    (F2I.S16 that rounds to nearest even, saturates and maps NaN to 0, then one
//    add-max and one min) instead of FRND, FADD, two clamps, a NaN select and F2I.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_common.cuh"

namespace qg::cuda {

// x when finite, NaN for +/-Inf and NaN, in one FMA: x * 0 is an exact +/-0 for finite x
// and NaN otherwise, and x + (+/-0) is x (a -0 stays -0: -0 * 0 = -0 and -0 + -0 = -0).
__device__ __forceinline__ float finite_or_nan_fma(float x) {
  return __fmaf_rn(x, 0.0f, x);
}

// The 16-bit types as two halves of a 32-bit word: element 2j in the low half, 2j + 1 in
// the high half (the memory order of a little-endian pack).
template <typename T>
struct Half2Of;
template <>
struct Half2Of<__nv_bfloat16> {
  using V = __nv_bfloat162;
};
template <>
struct Half2Of<__half> {
  using V = __half2;
};

template <typename T>
__device__ __forceinline__ typename Half2Of<T>::V as_pair(uint32_t w) {
  typename Half2Of<T>::V v;
  static_assert(sizeof(v) == 4, "two 16-bit halves");
  __builtin_memcpy(&v, &w, 4);
  return v;
}
template <typename T>
__device__ __forceinline__ uint32_t as_word(typename Half2Of<T>::V v) {
  uint32_t w;
  __builtin_memcpy(&w, &v, 4);
  return w;
}

// Both halves of w (16-bit type T) as f32: exact, one instruction each.
template <typename T>
__device__ __forceinline__ float low_as_float(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __uint_as_float(w << 16);
  else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
template <typename T>
__device__ __forceinline__ float high_as_float(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __uint_as_float(w & 0xffff0000u);
  else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// finite_or_nan_fma on both halves: one HFMA2 (bf16x2 / f16x2 FMA rounds once and keeps
// subnormals, so a finite half comes back unchanged).
template <typename T>
__device__ __forceinline__ uint32_t finite_or_nan2(uint32_t w) {
  using V = typename Half2Of<T>::V;
  const V zero = as_pair<T>(0u), v = as_pair<T>(w);
  return as_word<T>(__hfma2(v, zero, v));
}

// Both halves set to +Inf / -Inf (the empty min / max).
template <typename T>
__device__ __forceinline__ uint32_t pos_inf2() {
  return std::is_same_v<T, __nv_bfloat16> ? 0x7f807f80u : 0x7c007c00u;
}
template <typename T>
__device__ __forceinline__ uint32_t neg_inf2() {
  return pos_inf2<T>() | 0x80008000u;
}

// Half-wise min / max: a NaN operand yields the other one (like fminf / fmaxf), so
// the NaNs of finite_or_nan2 drop out. Exact, like every min / max.
template <typename T>
__device__ __forceinline__ uint32_t min2(uint32_t a, uint32_t b) {
  return as_word<T>(__hmin2(as_pair<T>(a), as_pair<T>(b)));
}
template <typename T>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  return as_word<T>(__hmax2(as_pair<T>(a), as_pair<T>(b)));
}

// clamp(rint(y) + zp, qmin, qmax), NaN -> zp, where zp lies in [qmin, qmax] and
// [qmin - zp, qmax - zp] within [-32768, 32767] (any 8-bit or 4-bit code range): the codes
// of qstore::quantize and int4::encode computed in f32. cvt.rni.sat.s16 rounds half to even
// as rintf does, maps NaN to 0 and saturates to [-32768, 32767]:
//  - rint(y) within that range: r = rint(y) exactly, and the CPU's f32 sum rint(y) + zp is
//    exact (below 2^24), so both clamp the same integer;
//  - rint(y) (or y = +/-Inf) past it: r = 32767 >= qmax - zp (or -32768 <= qmin - zp), and
//    rint(y) + zp lies past the same end, so both give qmax (qmin);
//  - NaN: r = 0 and clamp(zp) = zp, the CPU's NaN code.
// |r + zp| < 2^16, so the 32-bit add of VIADDMNMX cannot overflow. rint_sat_s16 is the
// cvt alone: r, sign-extended to 32 bits.
__device__ __forceinline__ int32_t rint_sat_s16(float y) {
  short r;
  asm("cvt.rni.sat.s16.f32 %0, %1;" : "=h"(r) : "f"(y));
  return r;
}
__device__ __forceinline__ int32_t code_of(float y, int32_t zp, int32_t qmin, int32_t qmax) {
  return min(__viaddmax_s32(rint_sat_s16(y), zp, qmin), qmax);
}

}  // namespace qg::cuda
