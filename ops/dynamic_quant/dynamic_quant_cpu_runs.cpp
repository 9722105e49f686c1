// SSE4.1 run loops of the CPU dynamic_range_quantize kernel (declared in
// dynamic_quant_cpu_runs.h); without SSE4.1 they are the scalar loops.
//
// Why each lane equals the scalar loop bit for bit:
//  * finiteness is v - v == 0, as qmath::is_finite; a non-finite lane is replaced by +inf
//    (min) / -inf (max), which never wins against the (+inf, -inf) start;
//  * _mm_min_ps(v, lo) is `v < lo ? v : lo` and _mm_max_ps(v, hi) is `v > hi ? v : hi`,
//    the scalar selects; min and max of non-zero values do not depend on the order, so
//    combining the lanes at the end gives the same bounds (up to the sign of a zero);
//  * the codes are the same f32 operations in the same order (_mm_round_ps with
//    round-to-nearest is rintf); the clamp max(qmin, q) then min(qmax, .) is qstore's
//    `q < qmin ? qmin : q` then `c > qmax ? qmax : c`, NaN passing through both, and a NaN
//    code becomes zp as in the scalar path; the codes are integers in [qmin, qmax], which
//    fit the storage type, so the saturating packs narrow them exactly;
//  * bf16/f16 widen exactly (ops/common/simd_widen.h).
#include "ops/dynamic_quant/dynamic_quant_cpu_runs.h"

#include <type_traits>

#include "ops/common/simd_widen.h"

namespace qg::dynq_cpu {
namespace {

#if defined(__SSE4_1__)

inline __m128 finite_or(__m128 v, __m128 fallback) {
  __m128 finite = _mm_cmpeq_ps(_mm_sub_ps(v, v), _mm_setzero_ps());
  return _mm_blendv_ps(fallback, v, finite);
}

inline float hmin(__m128 v) {
  alignas(16) float f[4];
  _mm_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < 4; ++i) m = f[i] < m ? f[i] : m;
  return m;
}

inline float hmax(__m128 v) {
  alignas(16) float f[4];
  _mm_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < 4; ++i) m = f[i] > m ? f[i] : m;
  return m;
}

template <typename T>
void finite_range_simd(const T* x, int64_t n, float* lo, float* hi) {
  const __m128 pinf = _mm_set1_ps(__builtin_inff()), ninf = _mm_set1_ps(-__builtin_inff());
  __m128 lo0 = pinf, lo1 = pinf, hi0 = ninf, hi1 = ninf;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128 a, b;
    simd::load8(x + j, &a, &b);
    lo0 = _mm_min_ps(finite_or(a, pinf), lo0);
    hi0 = _mm_max_ps(finite_or(a, ninf), hi0);
    lo1 = _mm_min_ps(finite_or(b, pinf), lo1);
    hi1 = _mm_max_ps(finite_or(b, ninf), hi1);
  }
  float l = hmin(_mm_min_ps(lo0, lo1)), h = hmax(_mm_max_ps(hi0, hi1));
  l = l < *lo ? l : *lo;
  h = h > *hi ? h : *hi;
  finite_range_scalar(x + j, n - j, &l, &h);
  *lo = l;
  *hi = h;
}

struct CodeParams {
  __m128 inv, zp, qmin, qmax;
};

inline __m128i codes4(__m128 x, const CodeParams& p) {
  __m128 q = _mm_add_ps(
      _mm_round_ps(_mm_mul_ps(x, p.inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), p.zp);
  __m128 c = _mm_min_ps(p.qmax, _mm_max_ps(p.qmin, q));
  c = _mm_blendv_ps(c, p.zp, _mm_cmpunord_ps(c, c));
  return _mm_cvttps_epi32(c);
}

template <typename T, typename Q>
void quantize_run_simd(const T* x, int64_t n, float inv, float zp, float qmin, float qmax, Q* q) {
  const CodeParams p = {_mm_set1_ps(inv), _mm_set1_ps(zp), _mm_set1_ps(qmin), _mm_set1_ps(qmax)};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m128 a, b, c, d;
    simd::load8(x + j, &a, &b);
    simd::load8(x + j + 8, &c, &d);
    __m128i lo = _mm_packs_epi32(codes4(a, p), codes4(b, p));
    __m128i hi = _mm_packs_epi32(codes4(c, p), codes4(d, p));
    __m128i bytes = std::is_signed_v<Q> ? _mm_packs_epi16(lo, hi) : _mm_packus_epi16(lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), bytes);
  }
  quantize_run_scalar(x + j, n - j, inv, zp, qmin, qmax, q + j);
}

#else

template <typename T>
void finite_range_simd(const T* x, int64_t n, float* lo, float* hi) {
  finite_range_scalar(x, n, lo, hi);
}

template <typename T, typename Q>
void quantize_run_simd(const T* x, int64_t n, float inv, float zp, float qmin, float qmax, Q* q) {
  quantize_run_scalar(x, n, inv, zp, qmin, qmax, q);
}

#endif  // __SSE4_1__

}  // namespace

void finite_range(const float* x, int64_t n, float* lo, float* hi) {
  finite_range_simd(x, n, lo, hi);
}
void finite_range(const bf16* x, int64_t n, float* lo, float* hi) {
  finite_range_simd(x, n, lo, hi);
}
void finite_range(const f16* x, int64_t n, float* lo, float* hi) {
  finite_range_simd(x, n, lo, hi);
}

void quantize_run(const float* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  int8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}
void quantize_run(const bf16* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  int8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}
void quantize_run(const f16* x, int64_t n, float inv, float zp, float qmin, float qmax, int8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}
void quantize_run(const float* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  uint8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}
void quantize_run(const bf16* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  uint8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}
void quantize_run(const f16* x, int64_t n, float inv, float zp, float qmin, float qmax,
                  uint8_t* q) {
  quantize_run_simd(x, n, inv, zp, qmin, qmax, q);
}

}  // namespace qg::dynq_cpu
