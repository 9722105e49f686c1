// SSE4.1 group loops of the CPU int4_quantize_pack kernel (declared in int4_cpu_runs.h);
// without SSE4.1 they are the scalar loops.
//
// Why each lane equals the scalar loop bit for bit:
//  * finiteness is v - v == 0, as qmath::is_finite; a non-finite lane is replaced by +inf
//    (min), -inf (max) or 0 (absmax), none of which changes the result;
//  * _mm_min_ps(v, m) / _mm_max_ps(v, m) are the scalar selects `v < m ? v : m` /
//    `v > m ? v : m`; |v| by clearing the sign bit differs from `v < 0 ? -v : v` only for
//    -0, which never raises absmax above its +0 start; min and max of non-zero values do not
//    depend on the order the lanes are combined in;
//  * codes are int4::encode's f32 operations in the same order (_mm_round_ps with
//    round-to-nearest is rintf); max(0, q) then min(15, .) is qmath::clamp, NaN passing
//    through both; NaN x becomes the zero point. A NaN code is left only for +-Inf in a group
//    whose scale overflowed to inf (inv 0): the scalar cast gives cvttss2si's 0x80000000,
//    whose low byte is 0, and the saturating packs of cvttps' 0x80000000 give 0 as well;
//  * bf16/f16 widen exactly (ops/common/simd_widen.h).
#include "ops/int4/int4_cpu_runs.h"

#include "ops/common/simd_widen.h"

namespace qg::int4_cpu {
namespace {

#if defined(__SSE4_1__)

inline float hreduce(__m128 v, bool take_min) {
  alignas(16) float f[4];
  _mm_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < 4; ++i) m = take_min ? (f[i] < m ? f[i] : m) : (f[i] > m ? f[i] : m);
  return m;
}

struct RangeAcc {
  __m128 lo = _mm_set1_ps(__builtin_inff());
  __m128 hi = _mm_set1_ps(-__builtin_inff());
  __m128 amax = _mm_setzero_ps();

  void add(__m128 v) {
    const __m128 finite = _mm_cmpeq_ps(_mm_sub_ps(v, v), _mm_setzero_ps());
    lo = _mm_min_ps(_mm_blendv_ps(_mm_set1_ps(__builtin_inff()), v, finite), lo);
    hi = _mm_max_ps(_mm_blendv_ps(_mm_set1_ps(-__builtin_inff()), v, finite), hi);
    const __m128 av = _mm_andnot_ps(_mm_set1_ps(-0.0f), _mm_and_ps(v, finite));
    amax = _mm_max_ps(av, amax);
  }
};

template <typename T>
Range<float> finite_range_simd(const T* x, int64_t n) {
  RangeAcc a0, a1;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128 a, b;
    simd::load8(x + j, &a, &b);
    a0.add(a);
    a1.add(b);
  }
  Range<float> r = finite_range_scalar(x + j, n - j);
  float lo = hreduce(_mm_min_ps(a0.lo, a1.lo), true);
  float hi = hreduce(_mm_max_ps(a0.hi, a1.hi), false);
  float am = hreduce(_mm_max_ps(a0.amax, a1.amax), false);
  r.min = lo < r.min ? lo : r.min;
  r.max = hi > r.max ? hi : r.max;
  r.absmax = am > r.absmax ? am : r.absmax;
  return r;
}

template <typename T>
float finite_absmax_simd(const T* x, int64_t n) {
  __m128 m0 = _mm_setzero_ps(), m1 = _mm_setzero_ps();
  const __m128 sign = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128 a, b;
    simd::load8(x + j, &a, &b);
    a = _mm_and_ps(a, _mm_cmpeq_ps(_mm_sub_ps(a, a), zero));
    b = _mm_and_ps(b, _mm_cmpeq_ps(_mm_sub_ps(b, b), zero));
    m0 = _mm_max_ps(_mm_andnot_ps(sign, a), m0);
    m1 = _mm_max_ps(_mm_andnot_ps(sign, b), m1);
  }
  float am = hreduce(_mm_max_ps(m0, m1), false);
  float tail = finite_absmax_scalar(x + j, n - j);
  return tail > am ? tail : am;
}

struct CodeParams {
  __m128 inv, zp;
};

inline __m128i codes4(__m128 x, const CodeParams& p) {
  __m128 q = _mm_add_ps(
      _mm_round_ps(_mm_mul_ps(x, p.inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), p.zp);
  __m128 c = _mm_min_ps(_mm_set1_ps(15.0f), _mm_max_ps(_mm_setzero_ps(), q));
  c = _mm_blendv_ps(c, p.zp, _mm_cmpunord_ps(x, x));
  return _mm_cvttps_epi32(c);
}

template <typename T>
void encode_pack_simd(const T* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                      bool high_first, uint8_t* packed) {
  int64_t j = 0;
  if ((first & 1) && n > 0) {  // the run starts in the high half of a pair: one element alone
    encode_pack_scalar(x, 1, first, p, high_first, packed);
    j = 1;
  }
  const CodeParams cp = {_mm_set1_ps(p.inv_scale), _mm_set1_ps(p.zero_point)};
  for (; j + 16 <= n; j += 16) {
    __m128 a, b, c, d;
    simd::load8(x + j, &a, &b);
    simd::load8(x + j + 8, &c, &d);
    __m128i codes = _mm_packus_epi16(_mm_packs_epi32(codes4(a, cp), codes4(b, cp)),
                                     _mm_packs_epi32(codes4(c, cp), codes4(d, cp)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + ((first + j) >> 1)),
                     pack_nibbles16(codes, high_first));
  }
  encode_pack_scalar(x + j, n - j, first + j, p, high_first, packed);
}

#else

template <typename T>
float finite_absmax_simd(const T* x, int64_t n) {
  return finite_absmax_scalar(x, n);
}

template <typename T>
Range<float> finite_range_simd(const T* x, int64_t n) {
  return finite_range_scalar(x, n);
}

template <typename T>
void encode_pack_simd(const T* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                      bool high_first, uint8_t* packed) {
  encode_pack_scalar(x, n, first, p, high_first, packed);
}

#endif  // __SSE4_1__

}  // namespace

Range<float> finite_range(const float* x, int64_t n) {
  return finite_range_simd(x, n);
}
Range<float> finite_range(const bf16* x, int64_t n) {
  return finite_range_simd(x, n);
}
Range<float> finite_range(const f16* x, int64_t n) {
  return finite_range_simd(x, n);
}

float finite_absmax(const float* x, int64_t n) {
  return finite_absmax_simd(x, n);
}
float finite_absmax(const bf16* x, int64_t n) {
  return finite_absmax_simd(x, n);
}
float finite_absmax(const f16* x, int64_t n) {
  return finite_absmax_simd(x, n);
}

void encode_pack(const float* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed) {
  encode_pack_simd(x, n, first, p, high_first, packed);
}
void encode_pack(const bf16* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed) {
  encode_pack_simd(x, n, first, p, high_first, packed);
}
void encode_pack(const f16* x, int64_t n, int64_t first, const int4::GroupParams<float>& p,
                 bool high_first, uint8_t* packed) {
  encode_pack_simd(x, n, first, p, high_first, packed);
}

}  // namespace qg::int4_cpu
