// SSE4.1 loads of eight f32 / bf16 / f16 elements as two f32 vectors, shared by the CPU
// fake-quantize loops and the fused quantize-code loops. Widening bf16 and f16 to f32 is
// exact, so these give the values the scalar static_cast<float> (Eigen's conversion) gives,
// bit for bit, NaN payloads included.
#pragma once

#if defined(__SSE4_1__)
#include <smmintrin.h>

#include "core/half.h"

namespace qg::simd {

inline void load8(const float* p, __m128* a, __m128* b) {
  *a = _mm_loadu_ps(p);
  *b = _mm_loadu_ps(p + 4);
}

// bf16 is the top half of an f32: widening is a 16-bit shift.
inline void load8(const bf16* p, __m128* a, __m128* b) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  *a = _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
  *b = _mm_castsi128_ps(_mm_unpackhi_epi16(_mm_setzero_si128(), h));
}

// Eigen's software half_to_float on four lanes holding f16 bits in their low halves: move
// exponent and mantissa into place and rebias; Inf/NaN get the f32 all-ones exponent, and
// zeros and subnormals (exponent 0) are renormalised by one exact f32 subtraction.
inline __m128 f16_to_f32_4(__m128i h) {
  const __m128i shifted_exp = _mm_set1_epi32(0x7c00 << 13);
  __m128i o = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);
  __m128i exp = _mm_and_si128(o, shifted_exp);
  o = _mm_add_epi32(o, _mm_set1_epi32((127 - 15) << 23));
  __m128i inf_nan = _mm_cmpeq_epi32(exp, shifted_exp);
  o = _mm_add_epi32(o, _mm_and_si128(inf_nan, _mm_set1_epi32((128 - 16) << 23)));
  __m128i denorm = _mm_cmpeq_epi32(exp, _mm_setzero_si128());
  __m128 renorm = _mm_sub_ps(_mm_castsi128_ps(_mm_add_epi32(o, _mm_set1_epi32(1 << 23))),
                             _mm_castsi128_ps(_mm_set1_epi32(113 << 23)));
  o = _mm_blendv_epi8(o, _mm_castps_si128(renorm), denorm);
  return _mm_castsi128_ps(
      _mm_or_si128(o, _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16)));
}

inline void load8(const f16* p, __m128* a, __m128* b) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  *a = f16_to_f32_4(_mm_unpacklo_epi16(h, _mm_setzero_si128()));
  *b = f16_to_f32_4(_mm_unpackhi_epi16(h, _mm_setzero_si128()));
}

}  // namespace qg::simd

#endif  // __SSE4_1__
