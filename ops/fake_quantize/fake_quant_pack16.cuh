// Fake quantization of one pack of 8 bf16 or f16 elements, two per 32-bit word, in about
// half the instructions of the element path (fake_quant_select, then from_math_select per
// element), for packs without NaN under tame qparams (QParam::tame: scale and 1/scale finite
// and non-zero in f32, a valid zero point, |qmin|, |qmax| <= 2^23). The caller runs the
// exact element path for every other pack, so the result is bit for bit qmath::fake_quant
// followed by the CPU's conversion. Per element it computes
//   r = rint(x * inv),  c = min(max(r, lo), hi),  y = fma(c, scale, +0),  mask = (r == c)
// with lo = qmin - zp and hi = qmax - zp (exact: integers below 2^24). Why this equals the
// reference q = r + zp, y = (clamp(q, qmin, qmax) - zp) * scale, mask = qmin <= q <= qmax:
// - no NaN anywhere: x is not NaN and inv is finite and non-zero, so x * inv and r are not
//   NaN (no 0 * Inf); c is finite and so is c * scale or it is +/-Inf. The two NaN selects
//   of the element path (y = x for a NaN x; the CPU's NaN encoding) are identities here.
// - zp folded out: if qmin <= q <= qmax, r + zp is an integer of magnitude <= 2^24, so it is
//   exact, and q - zp = r; if r > hi (r and hi are integers, so r >= hi + 1), q >= qmax + 1
//   by the monotonicity of rounding, and likewise r < lo gives q < qmin. Hence the mask is
//   lo <= r <= hi, and clamp(q) - zp (exact here) is r, lo or hi: the value of c.
// - min/max for the clamp and r == c for the mask: for a non-NaN r, min(max(r, lo), hi) has
//   the value of the select clamp, and r == c exactly when lo <= r <= hi (lo < hi; c is
//   finite, so r = +/-Inf is out of range).
// - signs of zero: the reference's clamp(q) - zp is never -0 (x - x = +0), but r and so c can
//   be -0 (rint(-0.3) = -0), and which zero min/max return for (+0, -0) is not relied on:
//   fma(c, scale, +0) adds +0 to the exact product and rounds once, which gives the rounded
//   product (the FMUL result) for every non-zero product and +0 for a zero one. This fma is
//   not a contraction of two reference steps: its addend is the constant +0.
// - packed conversion: cvt.rn.{bf16x2,f16x2}.f32 rounds each half to nearest even without
//   flushing subnormals, as cvt.rn.{bf16,f16}.f32 and Eigen's conversion do for non-NaN
//   values; the first operand goes to the low half (the lower address).
// - unpacking is exact: a bf16 is the upper 16 bits of its f32 (w << 16 for the low half,
//   w & 0xffff0000 for the high one); f16 -> f32 is exact.
// A host emulation of these steps over all 65536 bf16 inputs, 9 scales, 8 ranges and 4 zero
// points (both zero-sign conventions of min/max) matched qmath::fake_quant bit for bit;
// tests/gpu/fake_quant_16bit_test.cpp compares the device against the CPU.
#pragma once

#include <cstdint>

#include "ops/common/cuda_rows.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/common/quant_math.h"

namespace qg::cuda {

__device__ __forceinline__ float2 unpack_pair(const __nv_bfloat162& h) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(&h);
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack_pair(const __half2& h) {
  return __half22float2(h);
}

template <typename T>
__device__ __forceinline__ typename Half2Of<T>::V pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __floats2bfloat162_rn(lo, hi);
  else
    return __floats2half2_rn(lo, hi);
}

// Both halves of a pair word: -Inf (a neutral operand of max) or NaN.
template <typename T>
inline constexpr uint32_t kPairNegInf =
    std::is_same_v<T, __nv_bfloat16> ? 0xff80ff80u : 0xfc00fc00u;
template <typename T>
inline constexpr uint32_t kPairNaN = (std::is_same_v<T, __nv_bfloat16> ? half_bits::kBF16QuietNaN
                                                                       : half_bits::kF16QuietNaN) *
                                     0x10001u;

// True when none of the 8 elements of x is NaN and `poison` (kPairNegInf or kPairNaN, so
// that an untame qparam fails the same test) is not NaN: max with NaN propagation over the
// four pairs and poison, then an ordered compare of both halves with themselves.
template <typename T>
__device__ __forceinline__ bool no_nan_in(const Pack8<T>& x, uint32_t poison) {
  using P2 = typename Half2Of<T>::V;
  const P2* x2 = reinterpret_cast<const P2*>(x.v);
  const P2 p = *reinterpret_cast<const P2*>(&poison);
  P2 m = __hmax2_nan(__hmax2_nan(__hmax2_nan(x2[0], x2[1]), x2[2]), __hmax2_nan(x2[3], p));
  const uint32_t w = *reinterpret_cast<const uint32_t*>(&m);
  unsigned ok;
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("{\n\t.reg .pred p, q;\n\tsetp.eq.bf16x2 p|q, %1, %1;\n\tand.pred p, p, q;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(w));
  else
    asm("{\n\t.reg .pred p, q;\n\tsetp.eq.f16x2 p|q, %1, %1;\n\tand.pred p, p, q;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(w));
  return ok != 0;
}

// Writes y and the 8 mask bits of pack x, valid when no element of x is NaN (no_nan_in)
// and the qparams are tame (lo = qmin - zp, hi = qmax - zp); otherwise the caller must
// compute the pack element by element.
template <typename T>
__device__ __forceinline__ void fake_quant_pack16(const Pack8<T>& x, float inv, float scale,
                                                  float lo, float hi, Pack8<T>& y, unsigned& bits) {
  using P2 = typename Half2Of<T>::V;
  const P2* x2 = reinterpret_cast<const P2*>(x.v);
  P2* y2 = reinterpret_cast<P2*>(y.v);
  unsigned b = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = unpack_pair(x2[i]);
    float out[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float r = qmath::round_even((k == 0 ? v.x : v.y) * inv);
      const float c = fminf(fmaxf(r, lo), hi);
      // c * scale, with a -0 (from r = -0) made +0: the fma adds +0 to the exact product
      // and rounds once, so every other value is the product's (see the header comment).
      out[k] = __fmaf_rn(c, scale, 0.0f);
      b |= static_cast<unsigned>(r == c) << (2 * i + k);
    }
    y2[i] = pack_pair<T>(out[0], out[1]);
  }
  bits = b;
}

// The 32-bit mask of pair i (elements 2i, 2i + 1) of a pack from its mask byte: 0xffff in
// the half of each element whose bit is set. The multiply spreads 4 mask bits, one to the
// top bit of each byte (the shifted copies of the nibble do not overlap, so no carries), and
// prmt's sign-replicating selectors (nibble 8 | k) turn byte k into 0x00 or 0xff; 3
// instructions per pair instead of a test and a select per element.
__device__ __forceinline__ uint32_t pair_mask(unsigned bits, int i) {
  // Byte k's top bit = mask bit k (low nibble) or bit 4 + k (high nibble).
  const uint32_t spread = i < 2 ? (bits & 0x0fu) * 0x10204080u : (bits & 0xf0u) * 0x01020408u;
  uint32_t m;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(m) : "r"(spread), "r"(i % 2 == 0 ? 0x9988u : 0xbbaau));
  return m;
}

// The 8 elements of a pack kept (bit set) or made +0 (bit clear) by the bits of their mask
// byte: ste_backward's element rule, shared by its kernel and the fused nodes that apply it
// (fused_ste_chain, fused_ste_producer), so all move dy's bits or +0 the same way. 16-bit
// types go as 32-bit words ANDed with pair_mask.
template <typename T>
__device__ __forceinline__ Pack8<T> masked_pack(const Pack8<T>& v, unsigned bits) {
  Pack8<T> out;
  if constexpr (sizeof(T) == 2) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(v.v);
    uint32_t* o = reinterpret_cast<uint32_t*>(out.v);
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = w[i] & pair_mask(bits, i);
  } else {
    const T zero = from_math<T>(0);
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = (bits >> j) & 1u ? v.v[j] : zero;
  }
  return out;
}

// ste_backward_exact's element rule: dy kept (bit set) or dy * 0 (a zero with dy's sign, NaN
// for an infinite or NaN dy), PyTorch's `dy * mask`. The multiply runs in the math type.
template <typename T>
__device__ __forceinline__ Pack8<T> exact_masked_pack(const Pack8<T>& v, unsigned bits) {
  Pack8<T> out;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    out.v[j] = (bits >> j) & 1u ? v.v[j] : from_math<T>(to_math(v.v[j]) * math_of<T>(0));
  return out;
}

}  // namespace qg::cuda
