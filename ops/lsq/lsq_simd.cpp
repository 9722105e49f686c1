// Four f32 lanes per step, the f64 terms two lanes at a time. Why each lane equals
// lsq::element_grad<float>:
//  * v = x * inv, rint(v), q = r + zp_int are the same f32 operations (_mm_round_ps with
//    round-to-nearest is rintf);
//  * below / above are q < qmin / q > qmax, false for NaN q as in the scalar compares; NaN x
//    is tested on x itself;
//  * the f64 terms widen the same f32 values exactly and apply the same f64 operations in
//    the same order (no FMA: the x86-64-v2 build has none to contract into);
//  * lanes are chosen by blends, so an Inf or NaN in a term that is not chosen is dropped,
//    as the scalar selects drop it.
// The sums: lanes 0-1 and 2-3 accumulate in two f64 vectors each, added in a fixed order
// at the end; the scalar tail is added after them.
#include "ops/lsq/lsq_simd.h"

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "ops/lsq/lsq_math.h"

namespace qg::lsq_simd {
namespace {

// Element j of a run through the shared scalar math.
inline void scalar_one(const float* x, const float* dy, float* dx, int64_t j, const RunQParams& p,
                       RunSums& s) {
  auto e = lsq::element_grad<float>(x[j], dy[j], p.inv, p.scale, p.zp_int, p.qmin, p.qmax);
  dx[j] = e.dx;
  s.dscale += e.dscale;
  s.dzp += e.dzp;
}

#if defined(__SSE4_1__)

// The 64-bit lane masks of f32 lanes 0-1 (lo) and 2-3 (hi) of a 32-bit lane mask.
inline __m128d mask_lo(__m128 m) {
  __m128i i = _mm_castps_si128(m);
  return _mm_castsi128_pd(_mm_unpacklo_epi32(i, i));
}
inline __m128d mask_hi(__m128 m) {
  __m128i i = _mm_castps_si128(m);
  return _mm_castsi128_pd(_mm_unpackhi_epi32(i, i));
}
inline __m128d widen_lo(__m128 v) {
  return _mm_cvtps_pd(v);
}
inline __m128d widen_hi(__m128 v) {
  return _mm_cvtps_pd(_mm_movehl_ps(v, v));
}

struct Consts {
  __m128 inv, zp, qmin, qmax;
  __m128d inv_d, zp_d, qmin_d, qmax_d, scale_d;
};

// The dscale and dzero_point terms of two lanes (one half of a step).
inline void terms2(__m128d x, __m128d dy, __m128d r, __m128d below, __m128d inside, __m128d nan,
                   const Consts& c, __m128d& ds, __m128d& dz) {
  __m128d in_scale = _mm_mul_pd(dy, _mm_sub_pd(r, _mm_mul_pd(x, c.inv_d)));
  __m128d end = _mm_blendv_pd(c.qmax_d, c.qmin_d, below);
  __m128d out_scale = _mm_mul_pd(dy, _mm_sub_pd(end, c.zp_d));
  __m128d out_zp = _mm_mul_pd(_mm_xor_pd(dy, _mm_set1_pd(-0.0)), c.scale_d);
  __m128d zero = _mm_setzero_pd();
  __m128d scale_term = _mm_blendv_pd(_mm_blendv_pd(out_scale, zero, nan), in_scale, inside);
  __m128d zp_term = _mm_blendv_pd(out_zp, zero, _mm_or_pd(inside, nan));
  ds = _mm_add_pd(ds, scale_term);
  dz = _mm_add_pd(dz, zp_term);
}

#endif  // __SSE4_1__

}  // namespace

RunSums backward_run(const float* x, const float* dy, float* dx, int64_t n, const RunQParams& p) {
  RunSums s;
  int64_t j = 0;
#if defined(__SSE4_1__)
  Consts c{_mm_set1_ps(p.inv),  _mm_set1_ps(p.zp_int), _mm_set1_ps(p.qmin),
           _mm_set1_ps(p.qmax), _mm_set1_pd(p.inv),    _mm_set1_pd(p.zp_int),
           _mm_set1_pd(p.qmin), _mm_set1_pd(p.qmax),   _mm_set1_pd(p.scale)};
  __m128d ds_lo = _mm_setzero_pd(), ds_hi = ds_lo, dz_lo = ds_lo, dz_hi = ds_lo;
  for (; j + 4 <= n; j += 4) {
    __m128 xv = _mm_loadu_ps(x + j), dyv = _mm_loadu_ps(dy + j);
    __m128 r = _mm_round_ps(_mm_mul_ps(xv, c.inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128 q = _mm_add_ps(r, c.zp);
    __m128 below = _mm_cmplt_ps(q, c.qmin), above = _mm_cmpgt_ps(q, c.qmax);
    __m128 nan = _mm_cmpunord_ps(xv, xv);
    __m128 outside = _mm_or_ps(_mm_or_ps(below, above), nan);
    _mm_storeu_ps(dx + j, _mm_andnot_ps(outside, dyv));  // inside: dy's bits; else +0
    __m128 inside = _mm_andnot_ps(outside, _mm_castsi128_ps(_mm_set1_epi32(-1)));
    terms2(widen_lo(xv), widen_lo(dyv), widen_lo(r), mask_lo(below), mask_lo(inside), mask_lo(nan),
           c, ds_lo, dz_lo);
    terms2(widen_hi(xv), widen_hi(dyv), widen_hi(r), mask_hi(below), mask_hi(inside), mask_hi(nan),
           c, ds_hi, dz_hi);
  }
  // Lanes 0, 1, 2, 3 in that order.
  double lanes[4];
  _mm_storeu_pd(lanes, ds_lo);
  _mm_storeu_pd(lanes + 2, ds_hi);
  s.dscale = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  _mm_storeu_pd(lanes, dz_lo);
  _mm_storeu_pd(lanes + 2, dz_hi);
  s.dzp = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; j < n; ++j) scalar_one(x, dy, dx, j, p, s);
  return s;
}

}  // namespace qg::lsq_simd
