// The fast paths of the fused kernels, for the common case of a thread whose elements are all
// finite (checked once per thread, not per element) and qparams with a finite scale:
//
//  * Statistics from the raw bits with integer min/max (VIMNMX3, three operands, two 16-bit
//    lanes per instruction for f16/bf16): the bits of finite floats with the sign bit clear
//    order as their values, those with it set in reverse, and as signed integers every
//    negative pattern (-0 included) lies below every non-negative one; so three running
//    values give the exact ordered min and max (-0 below +0, as obsmath::ordered_min /
//    ordered_max) without unpacking an element:
//      smax = max as signed   -> the largest value when any element has the sign bit clear
//      umax = max as unsigned -> the most negative value when any element has the sign bit set
//      umin = min as unsigned -> the smallest non-negative value, or the negative value
//                                closest to zero when every element is negative
//    A NaN or an infinity is the largest magnitude of its sign, so it shows in smax or umax;
//    such a thread recomputes its statistics with minmax_add (the exact slow path).
//  * Quantization without the NaN selects: a finite x and a finite scale give a non-NaN q
//    (inv = 1/scale is finite and nonzero since scale >= eps), so the clamp is fminf/fmaxf,
//    in-range is (clamp(q) == q), and the output is never NaN, so 16-bit outputs are narrowed
//    two at a time (F2FP, round to nearest even, the CPU's rounding) with no NaN re-encoding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "ops/fused/observe_quantize/cuda_stats_and_store.cuh"

namespace qg::cuda::fused {

// Integer min/max over the raw bits of a thread's elements (see above): 32-bit lanes for
// f32, two 16-bit lanes for f16/bf16.
struct RawMinMax {
  unsigned smax, umax, umin;
};

template <typename T>
inline constexpr bool kHalfLanes = sizeof(T) == 2;

template <typename T>
__device__ __forceinline__ RawMinMax raw_identity() {
  if constexpr (kHalfLanes<T>)
    return {0x80008000u, 0u, 0xffffffffu};
  else
    return {0x80000000u, 0u, 0xffffffffu};
}

template <typename T>
__device__ __forceinline__ void raw_add2(RawMinMax& r, unsigned a, unsigned b) {
  if constexpr (kHalfLanes<T>) {
    r.smax = __vimax3_s16x2(r.smax, a, b);
    r.umax = __vimax3_u16x2(r.umax, a, b);
    r.umin = __vimin3_u16x2(r.umin, a, b);
  } else {
    r.smax = static_cast<unsigned>(
        __vimax3_s32(static_cast<int>(r.smax), static_cast<int>(a), static_cast<int>(b)));
    r.umax = __vimax3_u32(r.umax, a, b);
    r.umin = __vimin3_u32(r.umin, a, b);
  }
}

// Adds the four 32-bit words of a 16-byte pack.
template <typename T, int N>
__device__ __forceinline__ void raw_add(RawMinMax& r, const Pack<T, N>& p) {
  static_assert(sizeof(p) == 16, "a 16-byte pack");
  const uint4 w = *reinterpret_cast<const uint4*>(&p);
  raw_add2<T>(r, w.x, w.y);
  raw_add2<T>(r, w.z, w.w);
}

// True when no element added was NaN or infinite: the largest magnitude of either sign (in
// smax when a non-negative element exists, in umax when a negative one does; else an
// element's magnitude or 0) lies below the infinity pattern. Identity values are clean.
template <typename T>
__device__ __forceinline__ bool raw_clean(const RawMinMax& r) {
  if constexpr (kHalfLanes<T>) {
    const unsigned mag = __vmaxu2(r.smax & 0x7fff7fffu, r.umax & 0x7fff7fffu);
    // Exponent all ones: 0x7f80 (bf16) or 0x7c00 (f16). Adding 2^16 - that to a lane below
    // 0x8000 sets the lane's bit 15 exactly when the lane is at or above it, with no carry
    // into the next lane.
    constexpr unsigned kInf = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;
    constexpr unsigned kAdd = (0x8000u - kInf) * 0x10001u;
    return ((mag + kAdd) & 0x80008000u) == 0u;
  } else {
    const unsigned mag = max(r.smax & 0x7fffffffu, r.umax & 0x7fffffffu);
    return mag < 0x7f800000u;
  }
}

template <typename T>
__device__ __forceinline__ float float_of_bits(unsigned b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __uint_as_float(b << 16);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  else
    return __uint_as_float(b);
}

// One lane of a clean RawMinMax as batch statistics: the exact ordered min and max, and the
// zero-sign bits finish() needs (set for -0 as the min or +0 as the max: a lane that saw
// -0 and whose min is above it, or +0 with a max above it, can never decide a zero extreme).
template <typename T>
__device__ __forceinline__ MinMax raw_lane(unsigned smax, unsigned umax, unsigned umin) {
  constexpr unsigned kSign = kHalfLanes<T> ? 0x8000u : 0x80000000u;
  const bool any_nonneg = (smax & kSign) == 0u;
  const bool any_neg = umax >= kSign;
  MinMax m = minmax_identity();
  if (!any_nonneg && !any_neg) return m;  // no element
  const unsigned mx = any_nonneg ? smax : umin;
  const unsigned mn = any_neg ? umax : umin;
  m.mn = float_of_bits<T>(mn);
  m.mx = float_of_bits<T>(mx);
  m.zeros = (mn == kSign ? 1u : 0u) | (mx == 0u ? 2u : 0u);
  return m;
}

// The statistics of a clean RawMinMax. For 16-bit types the two lanes are first folded with
// the same integer min/max (each lane against its half-swapped copy), so one lane is
// converted.
template <typename T>
__device__ __forceinline__ MinMax raw_minmax(const RawMinMax& r) {
  if constexpr (kHalfLanes<T>) {
    auto swap = [](unsigned v) { return __byte_perm(v, 0u, 0x1032); };
    return raw_lane<T>(__vmaxs2(r.smax, swap(r.smax)) & 0xffffu,
                       __vmaxu2(r.umax, swap(r.umax)) & 0xffffu,
                       __vminu2(r.umin, swap(r.umin)) & 0xffffu);
  } else {
    return raw_lane<T>(r.smax, r.umax, r.umin);
  }
}

// Combines RawMinMax across `lanes` consecutive lanes (a power of two <= 32, xor shuffles:
// every lane gets the result); every lane of the warp must call it.
template <typename T>
__device__ __forceinline__ RawMinMax raw_lanes_reduce(RawMinMax r, int lanes) {
  for (int off = lanes / 2; off > 0; off >>= 1) {
    const unsigned s = __shfl_xor_sync(0xffffffffu, r.smax, off);
    const unsigned hi = __shfl_xor_sync(0xffffffffu, r.umax, off);
    const unsigned lo = __shfl_xor_sync(0xffffffffu, r.umin, off);
    if constexpr (kHalfLanes<T>) {
      r = {__vmaxs2(r.smax, s), __vmaxu2(r.umax, hi), __vminu2(r.umin, lo)};
    } else {
      r = {static_cast<unsigned>(max(static_cast<int>(r.smax), static_cast<int>(s))),
           max(r.umax, hi), min(r.umin, lo)};
    }
  }
  return r;
}

// Exact statistics of one pack (the slow path).
template <typename T, int N, typename M>
__device__ __forceinline__ void exact_add(M& m, const Pack<T, N>& p) {
#pragma unroll
  for (int e = 0; e < N; ++e) minmax_add(m, to_math(p.v[e]));
}

// Whether a QP allows the fast quantize path (see above; a disabled fake-quantize copies x
// and stays on the exact path, which handles it without math).
template <bool kCodes>
__device__ __forceinline__ bool qp_fast(const QP& qp) {
  return fabsf(qp.scale) < INFINITY && (kCodes || qp.on);
}
template <bool kCodes>
__device__ __forceinline__ bool qps_fast(const UniformQP& q) {
  return qp_fast<kCodes>(q.qp);
}
template <bool kCodes, int N>
__device__ __forceinline__ bool qps_fast(const ColumnQP<N>& q) {
  bool ok = true;
#pragma unroll
  for (int e = 0; e < N; ++e) ok = ok && qp_fast<kCodes>(q.qp[e]);
  return ok;
}

// The elements of a pack in f32 (16-bit types two at a time).
template <typename T, int N>
__device__ __forceinline__ void unpack(const Pack<T, N>& p, float (&x)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bf16 is the high half of an f32: one shift or one AND per element.
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      const unsigned w = *reinterpret_cast<const unsigned*>(&p.v[e]);
      x[e] = __uint_as_float(w << 16);
      x[e + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&p.v[e]));
      x[e] = f.x;
      x[e + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) x[e] = p.v[e];
  }
}

// Narrows N non-NaN f32 values to a pack (round to nearest even; 16-bit types in pairs).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> pack_of(const float (&y)[N]) {
  Pack<T, N> out;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int e = 0; e < N; e += 2)
      *reinterpret_cast<__nv_bfloat162*>(&out.v[e]) = __floats2bfloat162_rn(y[e], y[e + 1]);
  } else if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
    for (int e = 0; e < N; e += 2)
      *reinterpret_cast<__half2*>(&out.v[e]) = __floats2half2_rn(y[e], y[e + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) out.v[e] = y[e];
  }
  return out;
}

// Whether the quantizer's range allows the fast path: |qmin|, |qmax| <= 2^20 (every integer
// range up to 16 bits), which keeps zp and qmin - zp, qmax - zp small exact integers (the
// argument of quantize_store_fast).
__device__ __forceinline__ bool range_fast(float qmin, float qmax) {
  return fabsf(qmin) <= 1048576.0f && fabsf(qmax) <= 1048576.0f;
}

// The fake-quantized value and mask bit of one finite element, with lo = qmin - zp and
// hi = qmax - zp: y = clamp(r, lo, hi) * scale, r = rint(x * inv) + 0 (the +0 turns a -0
// into +0), in range iff clamp(r) == r. Equal to qmath::fake_quant when range_fast holds:
// for |r| < 2^23, q = r + zp is exact (|q| < 2^24), so qmin <= q <= qmax iff lo <= r <= hi,
// and (clamp(q) - zp) is exactly clamp(r, lo, hi) (a zero difference is +0 on both sides);
// for |r| >= 2^23 or infinite, q and r both lie beyond the same end (|lo|, |hi| <= 2^21).
__device__ __forceinline__ float fake_quant_fast(float x, float inv, float scale, float lo,
                                                 float hi, uint32_t& bits, int e) {
  const float r = qmath::round_even(x * inv) + 0.0f;
  const float c = fminf(fmaxf(r, lo), hi);
  bits |= static_cast<uint32_t>(c == r) << e;
  return c * scale;
}

// quantize_store for a pack of finite elements and qparams that pass qp_fast and a range
// that passes range_fast: the same values and bits (see the top of this file for why no NaN
// can arise).
template <bool kCodes, bool kStream, typename T, int N, typename QPs>
__device__ __forceinline__ uint32_t quantize_store_fast(const Pack<T, N>& in, void* y, int64_t j,
                                                        const QPs& qps, float qmin, float qmax) {
  float x[N];
  unpack(in, x);
  uint32_t bits = 0;
  float r[N];
  if constexpr (!kCodes && std::is_same_v<QPs, UniformQP>) {
    const QP& qp = qps.qp;
    const float lo = qmin - qp.zp, hi = qmax - qp.zp;  // exact (range_fast)
#pragma unroll
    for (int e = 0; e < N; ++e) r[e] = fake_quant_fast(x[e], qp.inv, qp.scale, lo, hi, bits, e);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const QP& qp = qps.at(e);
      const float q = qmath::round_even(x[e] * qp.inv) + qp.zp;
      const float c = fminf(fmaxf(q, qmin), qmax);  // q is not NaN: the clamp
      bits |= static_cast<uint32_t>(c == q) << e;   // qmin <= q <= qmax
      r[e] = kCodes ? c : (c - qp.zp) * qp.scale;
    }
  }
  if constexpr (kCodes) {
    Codes<N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) out.v[e] = static_cast<uint8_t>(static_cast<int32_t>(r[e]));
    store_word<kStream>(static_cast<Codes<N>*>(y) + j, out);
  } else {
    store_word<kStream>(static_cast<Pack<T, N>*>(y) + j, pack_of<T, N>(r));
  }
  return bits;
}

// quantize_store on the fast path when `fast` (the thread's elements are finite, the qparams
// pass qp_fast and the range range_fast), else on the exact one.
template <bool kCodes, bool kStream = false, typename T, int N, typename QPs>
__device__ __forceinline__ uint32_t quantize_pack(bool fast, const Pack<T, N>& in, void* y,
                                                  int64_t j, const QPs& qps, float qmin,
                                                  float qmax) {
  if (fast) return quantize_store_fast<kCodes, kStream>(in, y, j, qps, qmin, qmax);
  return quantize_store<kCodes, kStream>(in, y, j, qps, qmin, qmax);
}

}  // namespace qg::cuda::fused
