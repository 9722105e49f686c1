// Contiguous-group loops of the CPU int4_quantize_pack kernel (groups along the last axis):
// the finite range of a group and its packed 4-bit codes. The scalar templates are the
// reference (and the f64 path and the SIMD heads and tails); the f32/bf16/f16 overloads use
// SSE4.1 where the build has it and give the same bytes (tests/ops_int4 compares them).
#pragma once

#include <cstdint>
#include <limits>

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "core/half.h"
#include "ops/int4/int4_math.h"

namespace qg::int4_cpu {

template <typename M>
struct Range {
  M min, max, absmax;  // over the finite values; (+inf, -inf, 0) when there are none
};

template <typename T, typename M = math_t<T>>
Range<M> finite_range_scalar(const T* x, int64_t n) {
  Range<M> r = {std::numeric_limits<M>::infinity(), -std::numeric_limits<M>::infinity(), M(0)};
  for (int64_t j = 0; j < n; ++j) {
    M v = static_cast<M>(x[j]);
    if (!qmath::is_finite(v)) continue;
    r.min = v < r.min ? v : r.min;
    r.max = v > r.max ? v : r.max;
    M av = v < M(0) ? -v : v;
    r.absmax = av > r.absmax ? av : r.absmax;
  }
  return r;
}

// absmax over the finite values (0 when there are none): finite_range_scalar's absmax.
template <typename T, typename M = math_t<T>>
M finite_absmax_scalar(const T* x, int64_t n) {
  M amax = M(0);
  for (int64_t j = 0; j < n; ++j) {
    M v = static_cast<M>(x[j]);
    if (!qmath::is_finite(v)) continue;
    M av = v < M(0) ? -v : v;
    amax = av > amax ? av : amax;
  }
  return amax;
}

// ORs the codes of x[0, n), flat elements first .. first + n - 1, into `packed`.
template <typename T, typename M = math_t<T>>
void encode_pack_scalar(const T* x, int64_t n, int64_t first, const int4::GroupParams<M>& p,
                        bool high_first, uint8_t* packed) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t k = first + j;
    uint8_t c = int4::encode<M>(static_cast<M>(x[j]), p);
    packed[k >> 1] |= static_cast<uint8_t>(c << int4::nibble_shift(k, high_first));
  }
}

// The SIMD versions. min / max may differ from the scalar loop in the sign of a zero bound
// (the order of visiting +-0); asymmetric_params reads only whether a bound is < 0 or > 0.
// encode_pack expects the bytes it covers to be 0 on entry (as the scalar OR does); bytes
// whose two nibbles both lie in the run may be stored rather than OR-ed.
Range<float> finite_range(const float* x, int64_t n);
Range<float> finite_range(const bf16* x, int64_t n);
Range<float> finite_range(const f16* x, int64_t n);
inline Range<double> finite_range(const double* x, int64_t n) {
  return finite_range_scalar(x, n);
}

float finite_absmax(const float* x, int64_t n);
float finite_absmax(const bf16* x, int64_t n);
float finite_absmax(const f16* x, int64_t n);
inline double finite_absmax(const double* x, int64_t n) {
  return finite_absmax_scalar(x, n);
}

void encode_pack(const float* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed);
void encode_pack(const bf16* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed);
void encode_pack(const f16* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed);
inline void encode_pack(const double* x, int64_t n, int64_t first,
                        const int4::GroupParams<double>& p, bool high_first, uint8_t* packed) {
  encode_pack_scalar(x, n, first, p, high_first, packed);
}

#if defined(__SSE4_1__)
// 16 4-bit codes, one per byte in element order (the first at an even flat index), -> 8
// bytes of nibble pairs in the low half. In each 16-bit lane the even element is the low
// byte e and the odd one the high byte o, both < 16: low_first wants e | o << 4,
// high_first e << 4 | o.
inline __m128i pack_nibbles16(__m128i codes, bool high_first) {
  __m128i pairs = high_first ? _mm_or_si128(_mm_slli_epi16(codes, 4), _mm_srli_epi16(codes, 8))
                             : _mm_or_si128(codes, _mm_srli_epi16(codes, 4));
  return _mm_packus_epi16(_mm_and_si128(pairs, _mm_set1_epi16(0xFF)), _mm_setzero_si128());
}
#endif

}  // namespace qg::int4_cpu
