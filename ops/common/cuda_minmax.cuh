// A lane's running minimum and maximum over packs of 8 elements in few instructions, for the
// bandwidth-bound reducers whose element rule is "NaN wins" (torch.amin / amax). The scalar
// form (compare, NaN test, select: about 12 instructions an element for both) made
// dynamic_fake_quantize's statistics pass compute-bound on bf16 rows. Here:
// - bf16 / f16: paired min.NaN / max.NaN on two elements at once (sm_80+), one instruction
//   per element for both results;
// - f32: min.NaN / max.NaN (sm_80+), two an element;
// - f64, and devices before sm_80: the scalar rule.
// The results equal the scalar rule's except for the payload of a NaN and the sign of a zero
// minimum or maximum, which a reducer here must not depend on (every qparam formula that
// uses them propagates NaN and clamps the range to include +0 first; see each caller).
#pragma once

#include <type_traits>

#include "ops/common/cuda_common.cuh"

namespace qg::cuda {

template <typename M>
__device__ __forceinline__ M nan_min(M a, M b) {
  return a != a ? a : (b != b ? b : (b < a ? b : a));
}
template <typename M>
__device__ __forceinline__ M nan_max(M a, M b) {
  return a != a ? a : (b != b ? b : (b > a ? b : a));
}

__device__ __forceinline__ float nan_min_fast(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nan_min(a, b);
#endif
}
__device__ __forceinline__ float nan_max_fast(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nan_max(a, b);
#endif
}

// The generic accumulator: math-type scalars (f64; f32 with the fast instructions).
template <typename T>
struct PackMinMax {
  using M = math_of<T>;
  M mn, mx;
  __device__ __forceinline__ PackMinMax(M lo, M hi) : mn(lo), mx(hi) {}
  __device__ __forceinline__ void add(const Pack<T, 8>& v) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const M e = to_math(v.v[j]);
      if constexpr (std::is_same_v<M, float>) {
        mn = nan_min_fast(mn, e);
        mx = nan_max_fast(mx, e);
      } else {
        mn = nan_min(mn, e);
        mx = nan_max(mx, e);
      }
    }
  }
  __device__ __forceinline__ M min() const {
    return mn;
  }
  __device__ __forceinline__ M max() const {
    return mx;
  }
};

// 16-bit elements: two running pairs (element 2k and 2k + 1 of every pack), combined at the
// end. The start values (0 or +-infinity) are exact in T.
template <typename T, typename T2>
struct PairMinMax {
  T2 mn, mx;
  __device__ __forceinline__ PairMinMax(float lo, float hi)
      : mn(pair_of(from_math<T>(lo))), mx(pair_of(from_math<T>(hi))) {}
  static __device__ __forceinline__ T2 pair_of(T v) { return T2{v, v}; }
  __device__ __forceinline__ void add(const Pack<T, 8>& v) {
    const T2* p = reinterpret_cast<const T2*>(v.v);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      mn = __hmin2_nan(mn, p[k]);
      mx = __hmax2_nan(mx, p[k]);
    }
#else
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      mn = T2{from_math<T>(nan_min(to_math(mn.x), to_math(p[k].x))),
              from_math<T>(nan_min(to_math(mn.y), to_math(p[k].y)))};
      mx = T2{from_math<T>(nan_max(to_math(mx.x), to_math(p[k].x))),
              from_math<T>(nan_max(to_math(mx.y), to_math(p[k].y)))};
    }
#endif
  }
  __device__ __forceinline__ float min() const {
    return nan_min(to_math(mn.x), to_math(mn.y));
  }
  __device__ __forceinline__ float max() const {
    return nan_max(to_math(mx.x), to_math(mx.y));
  }
};

template <>
struct PackMinMax<__nv_bfloat16> : PairMinMax<__nv_bfloat16, __nv_bfloat162> {
  using PairMinMax::PairMinMax;
};
template <>
struct PackMinMax<__half> : PairMinMax<__half, __half2> {
  using PairMinMax::PairMinMax;
};

}  // namespace qg::cuda
