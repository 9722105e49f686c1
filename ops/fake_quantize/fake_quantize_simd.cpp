// SSE4.1 (in the x86-64-v2 baseline the build targets) fake_quantize and STE loops. Eight
// elements, one mask byte, per step; heads up to a mask-byte boundary and tails run the
// scalar qmath::fake_quant, and without SSE4.1 everything does.
//
// Why each lane equals the scalar path bit for bit:
//  * the operations are the same IEEE f32 operations in the same order; _mm_round_ps with
//    round-to-nearest is rintf (ties to even, -0 kept, NaN/Inf passed through);
//  * the clamp is written as max(qmin, min(qmax, q)) with the operand order that makes SSE's
//    min/max return q when q is NaN, as qmath::clamp does (q is NaN only when x * inv is
//    0 * Inf, i.e. a scale so small that 1 / scale overflows);
//  * NaN x returns x itself, as qmath::fake_quant does (f16/bf16 need only its sign);
//  * f16/bf16 widen exactly and narrow with Eigen's own round-to-nearest-even bit tricks
//    (the software paths: x86-64-v2 has no F16C), NaN becoming 0x7e00 / 0x7fc0 with its sign.
#include <type_traits>

#include "ops/fake_quantize/fake_quantize_simd.h"

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "ops/common/quant_math.h"
#include "ops/common/simd_widen.h"

namespace qg::fq_simd {
namespace {

// Qparams shared by a whole run.
struct ConstQ {
  const RunQParams& p;
  float inv(int64_t) const { return p.inv_scale; }
  float scale(int64_t) const { return p.scale; }
  float zp(int64_t) const { return p.zero_point; }
  float qmin() const { return p.qmin; }
  float qmax() const { return p.qmax; }
};

// Qparams read per element.
struct LaneQ {
  const LaneQParams& p;
  float inv(int64_t j) const { return p.inv_scale[j]; }
  float scale(int64_t j) const { return p.scale[j]; }
  float zp(int64_t j) const { return p.zero_point[j]; }
  float qmin() const { return p.qmin; }
  float qmax() const { return p.qmax; }
};

// Element j of a run, as the scalar kernel computes it; ORs its mask bit.
template <typename T, typename Q>
inline void scalar_one(const T* x, T* y, uint8_t* mask, int64_t first, int64_t j, const Q& q) {
  auto r = qmath::fake_quant<float>(static_cast<float>(x[j]), q.inv(j), q.scale(j), q.zp(j),
                                    q.qmin(), q.qmax());
  y[j] = static_cast<T>(r.y);
  int64_t k = first + j;
  mask[k >> 3] = static_cast<uint8_t>(mask[k >> 3] | (uint32_t{r.in_range} << (k & 7)));
}

#if defined(__SSE4_1__)

struct Vec4Q {
  __m128 inv, scale, zp;
};

// Four lanes of qmath::fake_quant<float>; the in-range lanes go to the low 4 bits of *bits.
// In range means clamp(q) == q: both are false for out-of-range and NaN q, and c equals q
// exactly otherwise. A NaN x already comes out as a NaN of the same sign (every SSE
// operation passes a NaN operand through, quietened); kKeepNanBits also returns its exact
// bits, which only f32 output keeps (f16/bf16 narrowing writes one canonical NaN per sign).
template <bool kKeepNanBits>
inline __m128 fake_quant4(__m128 x, const Vec4Q& q, __m128 qmin, __m128 qmax, int* bits) {
  __m128 t = _mm_mul_ps(x, q.inv);
  __m128 r = _mm_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128 v = _mm_add_ps(r, q.zp);
  __m128 c = _mm_max_ps(qmin, _mm_min_ps(qmax, v));
  __m128 y = _mm_mul_ps(_mm_sub_ps(c, q.zp), q.scale);
  *bits = _mm_movemask_ps(_mm_cmpeq_ps(c, v));
  if constexpr (kKeepNanBits) return _mm_blendv_ps(y, x, _mm_cmpunord_ps(x, x));
  return y;
}

// Element codecs: 8 elements <-> two f32 vectors.
struct F32Codec {
  static constexpr bool kKeepNanBits = true;
  static void load8(const float* p, __m128* a, __m128* b) { simd::load8(p, a, b); }
  static void store8(float* p, __m128 a, __m128 b) {
    _mm_storeu_ps(p, a);
    _mm_storeu_ps(p + 4, b);
  }
};

// bf16 is the top half of an f32: widening is a 16-bit shift; narrowing rounds to nearest
// even by adding 0x7fff plus the lowest kept bit. A NaN (always quiet here: it comes out of
// an SSE operation) first loses its payload below the quiet bit, so it narrows to
// 0x7fc0 / 0xffc0 without the rounding carry reaching the exponent.
inline __m128i bf16_bits4(__m128 f) {
  __m128i payload =
      _mm_and_si128(_mm_castps_si128(_mm_cmpunord_ps(f, f)), _mm_set1_epi32(0x3fffff));
  __m128i u = _mm_andnot_si128(payload, _mm_castps_si128(f));
  __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
  return _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)), lsb), 16);
}

struct BF16Codec {
  static constexpr bool kKeepNanBits = false;
  static void load8(const bf16* p, __m128* a, __m128* b) { simd::load8(p, a, b); }
  static void store8(bf16* p, __m128 a, __m128 b) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(bf16_bits4(a), bf16_bits4(b)));
  }
};

// Eigen's software float_to_half_rtne on four lanes; f16 bits in the low halves.
inline __m128i f32_to_f16_bits4(__m128 f) {
  __m128i u = _mm_castps_si128(f);
  __m128i sign = _mm_and_si128(u, _mm_set1_epi32(static_cast<int>(0x80000000u)));
  u = _mm_xor_si128(u, sign);  // |f|, so the signed integer compares below are safe
  __m128i inf_nan = _mm_cmpgt_epi32(u, _mm_set1_epi32(((127 + 16) << 23) - 1));
  __m128i special = _mm_blendv_epi8(_mm_set1_epi32(0x7c00), _mm_set1_epi32(0x7e00),
                                    _mm_cmpgt_epi32(u, _mm_set1_epi32(255 << 23)));
  __m128i subnormal = _mm_cmplt_epi32(u, _mm_set1_epi32(113 << 23));
  const __m128i denorm_magic = _mm_set1_epi32(((127 - 15) + (23 - 10) + 1) << 23);
  __m128i sub = _mm_sub_epi32(
      _mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(u), _mm_castsi128_ps(denorm_magic))),
      denorm_magic);
  __m128i mant_odd = _mm_and_si128(_mm_srli_epi32(u, 13), _mm_set1_epi32(1));
  __m128i normal = _mm_srli_epi32(
      _mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(static_cast<int>(0xc8000fffu))), mant_odd), 13);
  __m128i o = _mm_blendv_epi8(normal, sub, subnormal);
  o = _mm_blendv_epi8(o, special, inf_nan);
  return _mm_or_si128(o, _mm_srli_epi32(sign, 16));
}

struct F16Codec {
  static constexpr bool kKeepNanBits = false;
  static void load8(const f16* p, __m128* a, __m128* b) { simd::load8(p, a, b); }
  static void store8(f16* p, __m128 a, __m128 b) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(f32_to_f16_bits4(a), f32_to_f16_bits4(b)));
  }
};

template <typename T>
struct CodecOf;
template <>
struct CodecOf<float> {
  using type = F32Codec;
};
template <>
struct CodecOf<bf16> {
  using type = BF16Codec;
};
template <>
struct CodecOf<f16> {
  using type = F16Codec;
};

// Qparam vectors for elements j .. j+3 of a run.
struct ConstVec {
  Vec4Q q;
  explicit ConstVec(const RunQParams& p)
      : q{_mm_set1_ps(p.inv_scale), _mm_set1_ps(p.scale), _mm_set1_ps(p.zero_point)} {}
  const Vec4Q& at(int64_t) const { return q; }
};
struct LaneVec {
  const LaneQParams& p;
  explicit LaneVec(const LaneQParams& lp) : p(lp) {}
  Vec4Q at(int64_t j) const {
    return {_mm_loadu_ps(p.inv_scale + j), _mm_loadu_ps(p.scale + j),
            _mm_loadu_ps(p.zero_point + j)};
  }
};

#endif  // __SSE4_1__

template <typename T, typename Q, typename V>
void run(const T* x, T* y, uint8_t* mask, int64_t first, int64_t n, const Q& q, const V& vq) {
  int64_t j = 0;
  for (; j < n && ((first + j) & 7) != 0; ++j) scalar_one(x, y, mask, first, j, q);
#if defined(__SSE4_1__)
  using Codec = typename CodecOf<T>::type;
  const __m128 qmin = _mm_set1_ps(q.qmin()), qmax = _mm_set1_ps(q.qmax());
  for (; j + 8 <= n; j += 8) {
    __m128 a, b;
    Codec::load8(x + j, &a, &b);
    int lo, hi;
    a = fake_quant4<Codec::kKeepNanBits>(a, vq.at(j), qmin, qmax, &lo);
    b = fake_quant4<Codec::kKeepNanBits>(b, vq.at(j + 4), qmin, qmax, &hi);
    Codec::store8(y + j, a, b);
    mask[(first + j) >> 3] = static_cast<uint8_t>(lo | (hi << 4));
  }
#else
  (void)vq;
#endif
  for (; j < n; ++j) scalar_one(x, y, mask, first, j, q);
}

#if defined(__SSE4_1__)
template <typename T>
void run_const(const T* x, T* y, uint8_t* mask, int64_t first, int64_t n, const RunQParams& p) {
  run(x, y, mask, first, n, ConstQ{p}, ConstVec(p));
}
template <typename T>
void run_lanes(const T* x, T* y, uint8_t* mask, int64_t first, int64_t n, const LaneQParams& p) {
  run(x, y, mask, first, n, LaneQ{p}, LaneVec(p));
}
#else
template <typename T>
void run_const(const T* x, T* y, uint8_t* mask, int64_t first, int64_t n, const RunQParams& p) {
  run(x, y, mask, first, n, ConstQ{p}, 0);
}
template <typename T>
void run_lanes(const T* x, T* y, uint8_t* mask, int64_t first, int64_t n, const LaneQParams& p) {
  run(x, y, mask, first, n, LaneQ{p}, 0);
}
#endif

#if defined(__SSE4_1__)
// Lane masks for one mask byte: lane l of vector v has bit v * lanes + l set, the bit that
// selects it; a lane is kept when (byte & bit) == bit.
template <int kBytes>
struct SteBits;
template <>
struct SteBits<2> {
  static constexpr int kVecs = 1;
  __m128i bit[1] = {_mm_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128)};
  static __m128i splat(int m) { return _mm_set1_epi16(static_cast<int16_t>(m)); }
  static __m128i eq(__m128i a, __m128i b) { return _mm_cmpeq_epi16(a, b); }
};
template <>
struct SteBits<4> {
  static constexpr int kVecs = 2;
  __m128i bit[2] = {_mm_setr_epi32(1, 2, 4, 8), _mm_setr_epi32(16, 32, 64, 128)};
  static __m128i splat(int m) { return _mm_set1_epi32(m); }
  static __m128i eq(__m128i a, __m128i b) { return _mm_cmpeq_epi32(a, b); }
};
template <>
struct SteBits<8> {
  static constexpr int kVecs = 4;
  __m128i bit[4] = {_mm_set_epi64x(2, 1), _mm_set_epi64x(8, 4), _mm_set_epi64x(32, 16),
                    _mm_set_epi64x(128, 64)};
  static __m128i splat(int m) { return _mm_set1_epi64x(m); }
  static __m128i eq(__m128i a, __m128i b) { return _mm_cmpeq_epi64(a, b); }
};
#endif

// STE as bit operations: each mask byte selects 8 elements, kept or zeroed whole.
template <typename T>
void ste(const T* dy, const uint8_t* mask, T* dx, int64_t n) {
  int64_t i = 0;
#if defined(__SSE4_1__)
  using Bits = SteBits<sizeof(T)>;
  const Bits bits;
  for (; i + 8 <= n; i += 8) {
    __m128i m = Bits::splat(mask[i >> 3]);
    for (int v = 0; v < Bits::kVecs; ++v) {
      const T* src = dy + i + v * (16 / sizeof(T));
      __m128i keep = Bits::eq(_mm_and_si128(m, bits.bit[v]), bits.bit[v]);
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dx + i + v * (16 / sizeof(T))),
                       _mm_and_si128(keep, d));
    }
  }
#endif
  for (; i < n; ++i) dx[i] = ((mask[i >> 3] >> (i & 7)) & 1u) ? dy[i] : T(0);
}

// dy * 0 in the element's own arithmetic: the narrow types multiply in f32 and narrow back.
template <typename T>
T times_zero(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v * T(0);
  else
    return T(static_cast<float>(v) * 0.0f);
}

template <typename T>
void ste_exact_scalar(const T* dy, const uint8_t* mask, T* dx, int64_t first, int64_t last) {
  for (int64_t i = first; i < last; ++i)
    dx[i] = ((mask[i >> 3] >> (i & 7)) & 1u) ? dy[i] : times_zero(dy[i]);
}

// The exact STE: each lane is dy (kept) or dy * 0. f32/f64 multiply in SSE; the 16-bit types
// keep dy's sign bit, which is dy * 0 for every finite dy, and send a block holding a
// masked-out infinity or NaN to the scalar loop (whose multiply makes the NaN).
template <typename T>
void ste_exact(const T* dy, const uint8_t* mask, T* dx, int64_t n) {
  int64_t i = 0;
#if defined(__SSE4_1__)
  using Bits = SteBits<sizeof(T)>;
  const Bits bits;
  for (; i + 8 <= n; i += 8) {
    __m128i m = Bits::splat(mask[i >> 3]);
    bool scalar = false;
    for (int v = 0; v < Bits::kVecs && !scalar; ++v) {
      const int lanes = 16 / sizeof(T);
      const T* src = dy + i + v * lanes;
      T* dst = dx + i + v * lanes;
      __m128i keep = Bits::eq(_mm_and_si128(m, bits.bit[v]), bits.bit[v]);
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      __m128i zeroed;
      if constexpr (std::is_same_v<T, float>) {
        zeroed = _mm_castps_si128(_mm_mul_ps(_mm_castsi128_ps(d), _mm_setzero_ps()));
      } else if constexpr (std::is_same_v<T, double>) {
        zeroed = _mm_castpd_si128(_mm_mul_pd(_mm_castsi128_pd(d), _mm_setzero_pd()));
      } else {
        const int16_t exponent = std::is_same_v<T, bf16> ? 0x7f80 : 0x7c00;
        __m128i magnitude = _mm_and_si128(d, _mm_set1_epi16(0x7fff));
        __m128i non_finite = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(exponent - 1));
        if (_mm_movemask_epi8(_mm_andnot_si128(keep, non_finite)) != 0) scalar = true;
        zeroed = _mm_and_si128(d, _mm_set1_epi16(static_cast<int16_t>(0x8000)));
      }
      __m128i out = _mm_or_si128(_mm_and_si128(keep, d), _mm_andnot_si128(keep, zeroed));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), out);
    }
    if (scalar) ste_exact_scalar(dy, mask, dx, i, i + 8);
  }
#endif
  ste_exact_scalar(dy, mask, dx, i, n);
}

}  // namespace

void ste_backward_exact(const float* dy, const uint8_t* mask, float* dx, int64_t n) {
  ste_exact(dy, mask, dx, n);
}
void ste_backward_exact(const double* dy, const uint8_t* mask, double* dx, int64_t n) {
  ste_exact(dy, mask, dx, n);
}
void ste_backward_exact(const bf16* dy, const uint8_t* mask, bf16* dx, int64_t n) {
  ste_exact(dy, mask, dx, n);
}
void ste_backward_exact(const f16* dy, const uint8_t* mask, f16* dx, int64_t n) {
  ste_exact(dy, mask, dx, n);
}

void fake_quant_run(const float* x, float* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p) {
  run_const(x, y, mask, first, n, p);
}
void fake_quant_run(const bf16* x, bf16* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p) {
  run_const(x, y, mask, first, n, p);
}
void fake_quant_run(const f16* x, f16* y, uint8_t* mask, int64_t first, int64_t n,
                    const RunQParams& p) {
  run_const(x, y, mask, first, n, p);
}

void fake_quant_lanes(const float* x, float* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p) {
  run_lanes(x, y, mask, first, n, p);
}
void fake_quant_lanes(const bf16* x, bf16* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p) {
  run_lanes(x, y, mask, first, n, p);
}
void fake_quant_lanes(const f16* x, f16* y, uint8_t* mask, int64_t first, int64_t n,
                      const LaneQParams& p) {
  run_lanes(x, y, mask, first, n, p);
}

void ste_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n) {
  ste(dy, mask, dx, n);
}
void ste_backward(const double* dy, const uint8_t* mask, double* dx, int64_t n) {
  ste(dy, mask, dx, n);
}
void ste_backward(const bf16* dy, const uint8_t* mask, bf16* dx, int64_t n) {
  ste(dy, mask, dx, n);
}
void ste_backward(const f16* dy, const uint8_t* mask, f16* dx, int64_t n) {
  ste(dy, mask, dx, n);
}

}  // namespace qg::fq_simd
