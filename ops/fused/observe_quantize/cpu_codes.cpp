// Quantize-to-code loops of the CPU fused observer + quantizer; see cpu_codes.h.
// Why each SSE4.1 lane equals qstore::quantize<float>:
//  * x * inv, then _mm_round_ps to nearest (rintf: ties to even), then + zp: the same IEEE
//    operations in the same order;
//  * in range is (v >= qmin) & (v <= qmax), false for NaN as in the scalar code;
//  * the clamp of a non-NaN v equals the scalar selects (v is never -0: zp is an integer
//    and -0 + zp is +0), and a NaN v becomes zp, as the scalar code's last select does;
//  * the clamped value is an integer within the code range, so the truncating conversion
//    and the saturating packs are exact.
// Heads up to a mask-byte boundary and tails run the scalar code itself.
// Loads widen through ops/common/simd_widen.h, the same code the fake-quantize loops use.
#include "ops/fused/observe_quantize/cpu_codes.h"

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "ops/common/simd_widen.h"
#include "ops/quantize/quantize_math.h"

namespace qg::fused_cpu {
namespace {

struct ConstQ {
  const fq_simd::RunQParams& p;
  float inv(int64_t) const { return p.inv_scale; }
  float zp(int64_t) const { return p.zero_point; }
#if defined(__SSE4_1__)
  __m128 vinv(int64_t) const {
    return _mm_set1_ps(p.inv_scale);
  }
  __m128 vzp(int64_t) const {
    return _mm_set1_ps(p.zero_point);
  }
#endif
};

struct LaneQ {
  const fq_simd::LaneQParams& p;
  float inv(int64_t j) const { return p.inv_scale[j]; }
  float zp(int64_t j) const { return p.zero_point[j]; }
#if defined(__SSE4_1__)
  __m128 vinv(int64_t j) const {
    return _mm_loadu_ps(p.inv_scale + j);
  }
  __m128 vzp(int64_t j) const {
    return _mm_loadu_ps(p.zero_point + j);
  }
#endif
};

template <typename T, typename Q, typename P>
inline void scalar_one(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t j, const P& p,
                       float qmin, float qmax) {
  qstore::Code c = qstore::quantize<float>(static_cast<float>(x[j]), p.inv(j), p.zp(j), qmin, qmax);
  q[j] = static_cast<Q>(c.q);
  int64_t k = first + j;
  mask[k >> 3] = static_cast<uint8_t>(mask[k >> 3] | (uint32_t{c.in_range} << (k & 7)));
}

#if defined(__SSE4_1__)
inline __m128i codes4(__m128 x, __m128 inv, __m128 zp, __m128 qmin, __m128 qmax, int* bits) {
  __m128 r = _mm_round_ps(_mm_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128 v = _mm_add_ps(r, zp);
  *bits = _mm_movemask_ps(_mm_and_ps(_mm_cmpge_ps(v, qmin), _mm_cmple_ps(v, qmax)));
  __m128 c = _mm_min_ps(_mm_max_ps(v, qmin), qmax);
  return _mm_cvttps_epi32(_mm_blendv_ps(c, zp, _mm_cmpunord_ps(v, v)));
}

inline void store8(int8_t* q, __m128i a, __m128i b) {
  __m128i w = _mm_packs_epi32(a, b);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(w, w));
}
inline void store8(uint8_t* q, __m128i a, __m128i b) {
  __m128i w = _mm_packs_epi32(a, b);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packus_epi16(w, w));
}

using simd::load8;  // eight f32 / bf16 / f16 elements as two f32 vectors
#endif

template <typename T, typename Q, typename P>
void run(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t n, const P& p, float qmin,
         float qmax) {
  int64_t j = 0;
  for (; j < n && ((first + j) & 7) != 0; ++j) scalar_one(x, q, mask, first, j, p, qmin, qmax);
#if defined(__SSE4_1__)
  const __m128 vqmin = _mm_set1_ps(qmin), vqmax = _mm_set1_ps(qmax);
  for (; j + 8 <= n; j += 8) {
    int lo, hi;
    __m128 xa, xb;
    load8(x + j, &xa, &xb);
    __m128i a = codes4(xa, p.vinv(j), p.vzp(j), vqmin, vqmax, &lo);
    __m128i b = codes4(xb, p.vinv(j + 4), p.vzp(j + 4), vqmin, vqmax, &hi);
    store8(q + j, a, b);
    mask[(first + j) >> 3] = static_cast<uint8_t>(lo | (hi << 4));
  }
#endif
  for (; j < n; ++j) scalar_one(x, q, mask, first, j, p, qmin, qmax);
}

}  // namespace

template <typename T, typename Q>
void code_run(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t n,
              const fq_simd::RunQParams& p) {
  run(x, q, mask, first, n, ConstQ{p}, p.qmin, p.qmax);
}

template <typename T, typename Q>
void code_lanes(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t n,
                const fq_simd::LaneQParams& p) {
  run(x, q, mask, first, n, LaneQ{p}, p.qmin, p.qmax);
}

#define QG_FUSED_CODES(T, Q)                                               \
  template void code_run<T, Q>(const T*, Q*, uint8_t*, int64_t, int64_t,   \
                               const fq_simd::RunQParams&);                \
  template void code_lanes<T, Q>(const T*, Q*, uint8_t*, int64_t, int64_t, \
                                 const fq_simd::LaneQParams&);
QG_FUSED_CODES(float, int8_t)
QG_FUSED_CODES(float, uint8_t)
QG_FUSED_CODES(bf16, int8_t)
QG_FUSED_CODES(bf16, uint8_t)
QG_FUSED_CODES(f16, int8_t)
QG_FUSED_CODES(f16, uint8_t)
#undef QG_FUSED_CODES

}  // namespace qg::fused_cpu
