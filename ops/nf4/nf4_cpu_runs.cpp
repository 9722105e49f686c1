// SSE4.1 code loop of the CPU nf4_quantize_pack kernel (declared in nf4_cpu_runs.h);
// without SSE4.1 it is the scalar loop.
//
// Why each lane equals nf4::encode bit for bit: v = x * inv is the same f32 product; the
// code counts the midpoints (nf4::midpoint<float>, computed by the same function) strictly
// below v, one _mm_cmplt_ps per midpoint, each true lane adding 1 (subtracting the all-ones
// mask); a NaN v compares false everywhere and is then replaced by the code of 0.0, as the
// scalar early return does; +-Inf count 15 / 0 like any other value. bf16/f16 widen exactly
// (ops/common/simd_widen.h); pairs are packed by int4_cpu::pack_nibbles16.
#include "ops/nf4/nf4_cpu_runs.h"

#include "ops/common/simd_widen.h"
#include "ops/int4/int4_cpu_runs.h"

namespace qg::nf4_cpu {
namespace {

#if defined(__SSE4_1__)

struct Midpoints {
  __m128 m[15];
  Midpoints() {
    for (int i = 0; i < 15; ++i) m[i] = _mm_set1_ps(nf4::midpoint<float>(i));
  }
};

inline __m128i codes4(__m128 x, __m128 inv, const Midpoints& mp) {
  const __m128 v = _mm_mul_ps(x, inv);
  __m128i count = _mm_setzero_si128();
  for (int i = 0; i < 15; ++i)
    count = _mm_sub_epi32(count, _mm_castps_si128(_mm_cmplt_ps(mp.m[i], v)));
  return _mm_blendv_epi8(count, _mm_set1_epi32(nf4::kZeroCode),
                         _mm_castps_si128(_mm_cmpunord_ps(v, v)));
}

template <typename T>
void encode_pack_simd(const T* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                      uint8_t* packed) {
  int64_t j = 0;
  if ((first & 1) && n > 0) {  // the run starts in the high half of a pair: one element alone
    encode_pack_scalar(x, 1, first, inv_absmax, high_first, packed);
    j = 1;
  }
  static const Midpoints mp;  // computed once: 15 table look-ups per group add up
  const __m128 inv = _mm_set1_ps(inv_absmax);
  for (; j + 16 <= n; j += 16) {
    __m128 a, b, c, d;
    simd::load8(x + j, &a, &b);
    simd::load8(x + j + 8, &c, &d);
    __m128i codes = _mm_packus_epi16(_mm_packs_epi32(codes4(a, inv, mp), codes4(b, inv, mp)),
                                     _mm_packs_epi32(codes4(c, inv, mp), codes4(d, inv, mp)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + ((first + j) >> 1)),
                     int4_cpu::pack_nibbles16(codes, high_first));
  }
  encode_pack_scalar(x + j, n - j, first + j, inv_absmax, high_first, packed);
}

#else

template <typename T>
void encode_pack_simd(const T* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                      uint8_t* packed) {
  encode_pack_scalar(x, n, first, inv_absmax, high_first, packed);
}

#endif  // __SSE4_1__

}  // namespace

void encode_pack(const float* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed) {
  encode_pack_simd(x, n, first, inv_absmax, high_first, packed);
}
void encode_pack(const bf16* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed) {
  encode_pack_simd(x, n, first, inv_absmax, high_first, packed);
}
void encode_pack(const f16* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed) {
  encode_pack_simd(x, n, first, inv_absmax, high_first, packed);
}

}  // namespace qg::nf4_cpu
