// f32 batch statistics of the CPU fused observer + quantizer; see cpu_stats.h (bf16
// and f16 are in cpu_stats_16bit.cpp).
//  * Runs (one qparams index): plain SSE2 min/max with non-finite lanes replaced by +/-inf,
//    plus a record of which zero signs were seen (-0 wins the min, +0 the max).
//  * Lanes (one qparams index per column): the ordered keys of cpu_stats.h under
//    SSE4.1 integer min/max, which order signed zeros by themselves; eight rows at a time,
//    so the per-column ranges are loaded and stored once per eight rows.
#include "ops/fused/observe_quantize/cpu_stats.h"

#include <algorithm>
#include <cmath>
#if defined(__SSE4_1__)
#include <smmintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace qg::fused_cpu {
namespace {

struct RunStats {
  float mn = INFINITY, mx = -INFINITY;
  int64_t nonfinite = 0;
};

// Statistics of n contiguous values; n < 2^31 * 4 keeps the per-lane counters exact.
RunStats batch_stats(const float* x, int64_t n) {
  float mn = INFINITY, mx = -INFINITY;
  uint32_t neg0 = 0, pos0 = 0;
  int64_t nonfinite = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  // Four lanes at a time. Non-finite lanes are replaced by +/-inf before min/max, so
  // _mm_min_ps/_mm_max_ps never see NaN; the sign of a zero extreme is fixed below.
  const __m128 sign = _mm_set1_ps(-0.0f), inf = _mm_set1_ps(INFINITY),
               ninf = _mm_set1_ps(-INFINITY);
  const __m128 zero = _mm_setzero_ps();
  __m128 vmn = inf, vmx = ninf, vneg0 = zero, vpos0 = zero;
  __m128i vcnt = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(x + i);
    __m128 finite = _mm_cmplt_ps(_mm_andnot_ps(sign, v), inf);
    vmn = _mm_min_ps(vmn, _mm_or_ps(_mm_and_ps(finite, v), _mm_andnot_ps(finite, inf)));
    vmx = _mm_max_ps(vmx, _mm_or_ps(_mm_and_ps(finite, v), _mm_andnot_ps(finite, ninf)));
    vcnt = _mm_sub_epi32(
        vcnt, _mm_castps_si128(_mm_andnot_ps(finite, _mm_castsi128_ps(_mm_set1_epi32(-1)))));
    __m128 is_zero = _mm_cmpeq_ps(v, zero);
    __m128 negative = _mm_castsi128_ps(_mm_srai_epi32(_mm_castps_si128(v), 31));
    vneg0 = _mm_or_ps(vneg0, _mm_and_ps(is_zero, negative));
    vpos0 = _mm_or_ps(vpos0, _mm_andnot_ps(negative, is_zero));
  }
  alignas(16) float lo[4], hi[4];
  alignas(16) int32_t cnt[4];
  _mm_store_ps(lo, vmn);
  _mm_store_ps(hi, vmx);
  _mm_store_si128(reinterpret_cast<__m128i*>(cnt), vcnt);
  for (int k = 0; k < 4; ++k) {
    mn = lo[k] < mn ? lo[k] : mn;
    mx = hi[k] > mx ? hi[k] : mx;
    nonfinite += cnt[k];
  }
  neg0 = _mm_movemask_ps(vneg0) != 0;
  pos0 = _mm_movemask_ps(vpos0) != 0;
#endif
  for (; i < n; ++i) {
    float v = x[i];
    bool finite = std::fabs(v) < INFINITY;
    nonfinite += finite ? 0 : 1;
    float lo_v = finite ? v : INFINITY, hi_v = finite ? v : -INFINITY;
    mn = lo_v < mn ? lo_v : mn;
    mx = hi_v > mx ? hi_v : mx;
    bool is_zero = v == 0.0f;
    neg0 |= is_zero && std::signbit(v);
    pos0 |= is_zero && !std::signbit(v);
  }
  // -0 wins the min and +0 the max when a zero is the extreme.
  if (mn == 0.0f) mn = neg0 ? -0.0f : 0.0f;
  if (mx == 0.0f) mx = pos0 ? 0.0f : -0.0f;
  return {mn, mx, nonfinite};
}

void fold(Ranges& r, int64_t q, const RunStats& s) {
  r.lo[q] = std::min(r.lo[q], order_key(s.mn));
  r.hi[q] = std::max(r.hi[q], order_key(s.mx));
  r.nonfinite += s.nonfinite;
}

// Column ranges of `rows` rows of `width` values.
void lane_stats_f32(const float* x, int64_t rows, int64_t width, int32_t* lo, int32_t* hi,
                    int64_t* nonfinite) {
  const int32_t pos_inf_key = order_key(INFINITY), neg_inf_key = order_key(-INFINITY);
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t nr = std::min<int64_t>(8, rows - r0);
    const float* base = x + r0 * width;
    int64_t j = 0;
#if defined(__SSE4_1__)
    const __m128i abs_mask = _mm_set1_epi32(0x7fffffff), inf_bits = _mm_set1_epi32(0x7f800000);
    const __m128i vpos = _mm_set1_epi32(pos_inf_key), vneg = _mm_set1_epi32(neg_inf_key);
    __m128i vcnt = _mm_setzero_si128();
    for (; j + 4 <= width; j += 4) {
      __m128i vlo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + j));
      __m128i vhi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + j));
      for (int64_t r = 0; r < nr; ++r) {
        __m128i b = _mm_castps_si128(_mm_loadu_ps(base + r * width + j));
        __m128i finite = _mm_cmpgt_epi32(inf_bits, _mm_and_si128(b, abs_mask));
        __m128i key = _mm_xor_si128(b, _mm_and_si128(_mm_srai_epi32(b, 31), abs_mask));
        vlo = _mm_min_epi32(vlo, _mm_blendv_epi8(vpos, key, finite));
        vhi = _mm_max_epi32(vhi, _mm_blendv_epi8(vneg, key, finite));
        vcnt = _mm_sub_epi32(vcnt, _mm_cmpeq_epi32(finite, _mm_setzero_si128()));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + j), vlo);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + j), vhi);
    }
    alignas(16) int32_t cnt[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(cnt), vcnt);
    *nonfinite += int64_t{cnt[0]} + cnt[1] + cnt[2] + cnt[3];
#endif
    for (; j < width; ++j)
      for (int64_t r = 0; r < nr; ++r) {
        float v = base[r * width + j];
        if (!(std::fabs(v) < INFINITY)) {
          ++*nonfinite;
          continue;
        }
        lo[j] = std::min(lo[j], order_key(v));
        hi[j] = std::max(hi[j], order_key(v));
      }
  }
}

}  // namespace

Ranges::Ranges(int64_t n)
    : lo(static_cast<size_t>(n), order_key(INFINITY)),
      hi(static_cast<size_t>(n), order_key(-INFINITY)) {}

void merge_ranges(const Ranges& local, int64_t base, Ranges& shared) {
  for (size_t j = 0; j < local.lo.size(); ++j) {
    int32_t* lo = &shared.lo[base + j];
    int32_t* hi = &shared.hi[base + j];
    int32_t cur = __atomic_load_n(lo, __ATOMIC_RELAXED);
    while (local.lo[j] < cur && !__atomic_compare_exchange_n(lo, &cur, local.lo[j], true,
                                                             __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    cur = __atomic_load_n(hi, __ATOMIC_RELAXED);
    while (local.hi[j] > cur && !__atomic_compare_exchange_n(hi, &cur, local.hi[j], true,
                                                             __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
  }
  __atomic_fetch_add(&shared.nonfinite, local.nonfinite, __ATOMIC_RELAXED);
}

void run_stats(const float* x, int64_t n, int64_t q, Ranges& r) {
  constexpr int64_t kChunk = int64_t{1} << 30;  // keeps batch_stats' 32-bit counters exact
  for (int64_t k = 0; k < n; k += kChunk) fold(r, q, batch_stats(x + k, std::min(kChunk, n - k)));
}

void lane_stats(const float* x, int64_t rows, int64_t width, int64_t q0, Ranges& r) {
  lane_stats_f32(x, rows, width, r.lo.data() + q0, r.hi.data() + q0, &r.nonfinite);
}

}  // namespace qg::fused_cpu
