// bf16/f16 statistics of the CPU fused observer + quantizer (cpu_stats.h), in a file
// of their own because they work on the 16-bit encodings rather than on f32: widening to
// f32 is exact and order-preserving (signed zeros included), so the minimum of the widened
// values is the widened minimum. Sixteen-bit ordered keys (the sign-magnitude trick of
// order_key) under SSE2 integer min/max find the extremes eight values at a time, and only
// the two extremes of each range are widened, through Eigen as the observer kernels widen.
#include <algorithm>
#include <cstring>
#include <type_traits>
#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "ops/fused/observe_quantize/cpu_stats.h"

namespace qg::fused_cpu {
namespace {

inline int16_t key16(uint16_t h) {
  auto b = static_cast<int16_t>(h);
  return static_cast<int16_t>(b ^ ((b >> 15) & 0x7fff));
}

template <typename T>
constexpr uint16_t kInfBits = std::is_same_v<T, bf16> ? 0x7f80 : 0x7c00;

// The f32 range key of the 16-bit value whose key is k.
template <typename T>
int32_t widened_key(int16_t k) {
  auto b = static_cast<uint16_t>(k ^ ((k >> 15) & 0x7fff));
  T v;
  std::memcpy(static_cast<void*>(&v), &b, sizeof v);  // Eigen's types hold just the bits
  return order_key(static_cast<float>(v));
}

inline uint16_t load16(const void* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, sizeof h);
  return h;
}

// Folds one value into a key range (non-finite values only counted).
inline void fold_one(uint16_t h, uint16_t inf, int16_t& lo, int16_t& hi, int64_t& nonfinite) {
  if ((h & 0x7fff) >= inf) {
    ++nonfinite;
    return;
  }
  lo = std::min(lo, key16(h));
  hi = std::max(hi, key16(h));
}

#if defined(__SSE4_1__)
// Eight values' keys, non-finite ones replaced by the empty range's ends; `nonfinite`
// lanes become -1.
struct Keys8 {
  __m128i lo, hi, nonfinite;
};
inline Keys8 keys8(const void* p, __m128i inf, __m128i pos, __m128i neg) {
  const __m128i b = _mm_loadu_si128(static_cast<const __m128i*>(p));
  const __m128i abs_mask = _mm_set1_epi16(0x7fff);
  __m128i finite = _mm_cmpgt_epi16(inf, _mm_and_si128(b, abs_mask));
  __m128i key = _mm_xor_si128(b, _mm_and_si128(_mm_srai_epi16(b, 15), abs_mask));
  return {_mm_blendv_epi8(pos, key, finite), _mm_blendv_epi8(neg, key, finite),
          _mm_cmpeq_epi16(finite, _mm_setzero_si128())};
}
inline int64_t sum_epi32(__m128i v) {
  alignas(16) int32_t c[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(c), v);
  return int64_t{c[0]} + c[1] + c[2] + c[3];
}
#endif

template <typename T>
void run_keys(const T* x, int64_t n, int16_t& lo, int16_t& hi, int64_t& nonfinite) {
  const uint16_t inf = kInfBits<T>;
  int64_t i = 0;
#if defined(__SSE4_1__)
  const __m128i vinf = _mm_set1_epi16(static_cast<int16_t>(inf));
  const __m128i pos = _mm_set1_epi16(lo), neg = _mm_set1_epi16(hi), ones = _mm_set1_epi16(1);
  __m128i vlo = pos, vhi = neg, cnt = _mm_setzero_si128();
  while (i + 8 <= n) {
    // 16-bit counters move to 32 bits every 4096 vectors, before they can overflow.
    __m128i cnt16 = _mm_setzero_si128();
    for (int v = 0; v < 4096 && i + 8 <= n; ++v, i += 8) {
      Keys8 k = keys8(x + i, vinf, pos, neg);
      vlo = _mm_min_epi16(vlo, k.lo);
      vhi = _mm_max_epi16(vhi, k.hi);
      cnt16 = _mm_sub_epi16(cnt16, k.nonfinite);
    }
    cnt = _mm_add_epi32(cnt, _mm_madd_epi16(cnt16, ones));
  }
  alignas(16) int16_t l[8], h[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(l), vlo);
  _mm_store_si128(reinterpret_cast<__m128i*>(h), vhi);
  for (int k = 0; k < 8; ++k) {
    lo = std::min(lo, l[k]);
    hi = std::max(hi, h[k]);
  }
  nonfinite += sum_epi32(cnt);
#endif
  for (; i < n; ++i) fold_one(load16(x, i), inf, lo, hi, nonfinite);
}

// Per-column keys of `rows` rows of `width` values, `stride` apart, eight rows at a time.
template <typename T>
void lane_keys(const T* x, int64_t rows, int64_t width, int64_t stride, int16_t* lo, int16_t* hi,
               int64_t& nonfinite) {
  const uint16_t inf = kInfBits<T>;
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t nr = std::min<int64_t>(8, rows - r0);
    const T* base = x + r0 * stride;
    int64_t j = 0;
#if defined(__SSE4_1__)
    const __m128i vinf = _mm_set1_epi16(static_cast<int16_t>(inf));
    const __m128i pos = _mm_set1_epi16(key16(inf)), neg = _mm_set1_epi16(key16(0x8000 | inf));
    __m128i cnt = _mm_setzero_si128();
    for (; j + 8 <= width; j += 8) {
      __m128i vlo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + j));
      __m128i vhi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + j));
      __m128i cnt16 = _mm_setzero_si128();  // at most 8 per lane
      for (int64_t r = 0; r < nr; ++r) {
        Keys8 k = keys8(base + r * stride + j, vinf, pos, neg);
        vlo = _mm_min_epi16(vlo, k.lo);
        vhi = _mm_max_epi16(vhi, k.hi);
        cnt16 = _mm_sub_epi16(cnt16, k.nonfinite);
      }
      cnt = _mm_add_epi32(cnt, _mm_madd_epi16(cnt16, _mm_set1_epi16(1)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + j), vlo);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + j), vhi);
    }
    nonfinite += sum_epi32(cnt);
#endif
    for (; j < width; ++j)
      for (int64_t r = 0; r < nr; ++r)
        fold_one(load16(base + r * stride, j), inf, lo[j], hi[j], nonfinite);
  }
}

template <typename T>
void run_stats16(const T* x, int64_t n, int64_t q, Ranges& r) {
  int16_t lo = key16(kInfBits<T>), hi = key16(0x8000 | kInfBits<T>);
  run_keys(x, n, lo, hi, r.nonfinite);
  r.lo[q] = std::min(r.lo[q], widened_key<T>(lo));
  r.hi[q] = std::max(r.hi[q], widened_key<T>(hi));
}

// Columns in tiles whose key ranges fit on the stack.
template <typename T>
void lane_stats16(const T* x, int64_t rows, int64_t width, int64_t q0, Ranges& r) {
  constexpr int64_t kTile = 1024;
  int16_t lo[kTile], hi[kTile];
  for (int64_t j0 = 0; j0 < width; j0 += kTile) {
    const int64_t w = std::min(kTile, width - j0);
    std::fill(lo, lo + w, key16(kInfBits<T>));
    std::fill(hi, hi + w, key16(0x8000 | kInfBits<T>));
    lane_keys(x + j0, rows, w, width, lo, hi, r.nonfinite);
    for (int64_t j = 0; j < w; ++j) {
      const int64_t q = q0 + j0 + j;
      r.lo[q] = std::min(r.lo[q], widened_key<T>(lo[j]));
      r.hi[q] = std::max(r.hi[q], widened_key<T>(hi[j]));
    }
  }
}

}  // namespace

void run_stats(const bf16* x, int64_t n, int64_t q, Ranges& r) {
  run_stats16(x, n, q, r);
}
void run_stats(const f16* x, int64_t n, int64_t q, Ranges& r) {
  run_stats16(x, n, q, r);
}
void lane_stats(const bf16* x, int64_t rows, int64_t width, int64_t q0, Ranges& r) {
  lane_stats16(x, rows, width, q0, r);
}
void lane_stats(const f16* x, int64_t rows, int64_t width, int64_t q0, Ranges& r) {
  lane_stats16(x, rows, width, q0, r);
}

}  // namespace qg::fused_cpu
