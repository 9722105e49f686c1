// Building blocks of the bandwidth-bound quantization kernels (fake_quantize, LSQ, dynamic
// quantize, INT4/NF4 packing): an index type chosen per launch (32-bit arithmetic whenever
// the tensor has fewer than 2^31 elements, since 64-bit division and multiplication cost
// several times more instructions), packs of 8 elements loaded as whole 16-byte
// transactions, a flat launch shape (each block streams one contiguous run of packs: on an
// H200 this beat a grid-stride loop by ~20% for f32 packs), branch-free conversions (a
// branch per element serialises the 8 elements of a pack), and exact (order-independent)
// min/max reductions over a power-of-two team of lanes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_common.cuh"

namespace qg::cuda {

// Calls fn(I{}) with I = uint32_t when every flat index is below 2^31 (so index + grid
// stride never wraps), else int64_t.
template <typename Fn>
void dispatch_index(int64_t n, Fn&& fn) {
  if (n < (int64_t{1} << 31))
    fn(uint32_t{});
  else
    fn(int64_t{});
}

// Remembers the last qparam index loaded, so a run of elements sharing one qparam loads (and
// validates) it once. `load(index)` returns the qparam.
template <typename P, typename I, typename Load>
struct LastQParam {
  Load load;
  I index = ~I(0);
  P p{};
  __device__ __forceinline__ const P& get(I qi) {
    if (qi != index) {
      p = load(qi);
      index = qi;
    }
    return p;
  }
};

template <typename P, typename I, typename Load>
__device__ __forceinline__ LastQParam<P, I, Load> last_qparam(Load load) {
  return {load};
}

template <typename I>
__device__ __forceinline__ I thread_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I thread_stride() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

// 8 consecutive elements: one mask byte, one 16-byte load for 16-bit types (two for f32).
template <typename T>
using Pack8 = Pack<T, 8>;

// Pack `b` (elements 8b .. 8b+7) of p; 16-byte loads when p is 16-byte aligned.
template <typename T, typename I>
__device__ __forceinline__ Pack8<T> load_pack(const T* __restrict__ p, I b, bool vec) {
  if (vec) return reinterpret_cast<const Pack8<T>*>(p)[b];
  Pack8<T> v;
#pragma unroll
  for (int j = 0; j < 8; ++j) v.v[j] = p[b * 8 + j];
  return v;
}

template <typename T, typename I>
__device__ __forceinline__ void store_pack(T* __restrict__ p, I b, bool vec, const Pack8<T>& v) {
  if (vec) {
    reinterpret_cast<Pack8<T>*>(p)[b] = v;
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) p[b * 8 + j] = v.v[j];
}

// Threads per block of the flat pack kernels.
inline constexpr int kPackThreads = 256;

// Packs per thread: two for 16-bit types (a 16-byte pack of 8 is little work per thread),
// one otherwise.
template <typename T>
inline constexpr int kPacksPerThread = sizeof(T) == 2 ? 2 : 1;

// Blocks that cover `npacks` packs, U per thread.
template <int U>
inline unsigned pack_blocks(int64_t npacks) {
  int64_t per_block = int64_t{kPackThreads} * U;
  int64_t blocks = (npacks + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

// Block b handles packs [b * U * kPackThreads, (b + 1) * U * kPackThreads): thread t the
// packs t, t + kPackThreads, ... Every input is loaded (load(b)) before any pack is
// processed (body(b, loaded)), so U loads per thread are in flight at once.
// Unroll: false keeps the U bodies a loop (a body with many branches, copied U times and
// then again into each branch by the compiler, can grow the kernel several-fold).
template <int U, bool Unroll = true, typename I, typename Load, typename Body>
__device__ __forceinline__ void flat_packs(I npacks, Load load, Body body) {
  const I base =
      static_cast<I>(blockIdx.x) * static_cast<I>(U * kPackThreads) + static_cast<I>(threadIdx.x);
  decltype(load(base)) v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const I b = base + static_cast<I>(u * kPackThreads);
    if (b < npacks) v[u] = load(b);
  }
  if constexpr (Unroll) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I b = base + static_cast<I>(u * kPackThreads);
      if (b < npacks) body(b, v[u]);
    }
  } else {
    // v[0] is always the current pack (the rest move down), so that v stays in registers
    // (v[u] with a loop-variable u would live in local memory).
#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      const I b = base + static_cast<I>(u * kPackThreads);
      if (b < npacks) body(b, v[0]);
#pragma unroll
      for (int k = 0; k + 1 < U; ++k) v[k] = v[k + 1];
    }
  }
}

// from_math<T> without a branch (core/half_bits.h's select forms).
template <typename T>
__device__ __forceinline__ T from_math_select(math_of<T> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __ushort_as_bfloat16(half_bits::f32_to_bf16_select(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __ushort_as_half(half_bits::f32_to_f16_select(v));
  } else {
    return static_cast<T>(v);
  }
}

// v when finite, else NaN: fmin/fmax ignore a NaN operand, so min/max over finite values
// need no branch.
__device__ __forceinline__ float finite_or_nan(float v) {
  return fabsf(v) < INFINITY ? v : NAN;
}
__device__ __forceinline__ double finite_or_nan(double v) {
  return fabs(v) < static_cast<double>(INFINITY) ? v : static_cast<double>(NAN);
}
__device__ __forceinline__ float fmin_of(float a, float b) {
  return fminf(a, b);
}
__device__ __forceinline__ double fmin_of(double a, double b) {
  return fmin(a, b);
}
__device__ __forceinline__ float fmax_of(float a, float b) {
  return fmaxf(a, b);
}
__device__ __forceinline__ double fmax_of(double a, double b) {
  return fmax(a, b);
}

// True when every aligned run of `w` consecutive elements shares one qparam, so a kernel
// may look the qparam up once per run.
inline bool runs_share_qparam(const ScopeDims& d, int64_t w) {
  switch (d.kind) {
    case ScopeKind::tensor:
      return true;
    case ScopeKind::channel:
      return d.inner % w == 0;
    case ScopeKind::token:
      return (d.axis_len * d.inner) % w == 0;
    default:
      return d.inner == 1 && d.axis_len % w == 0 && d.group_size % w == 0;
  }
}

// Length of the contiguous segment of each qparam when qparam q owns exactly the elements
// [q * len, (q + 1) * len) (token rows, the channels of an outer == 1 layout, full groups
// along the last axis, the whole tensor); 0 otherwise.
inline int64_t contiguous_segment(const ScopeDims& d) {
  switch (d.kind) {
    case ScopeKind::tensor:
      return d.outer * d.axis_len * d.inner;
    case ScopeKind::channel:
      return d.outer == 1 ? d.inner : 0;
    case ScopeKind::token:
      return d.axis_len * d.inner;
    default:
      return d.inner == 1 && d.axis_len % d.group_size == 0 ? d.group_size : 0;
  }
}

// min / max / absmax combine exactly, so any reduction order gives the same value (only
// the sign of a zero min or max may differ, which no qparam formula can see: each clamps
// the range to include +0 first).
template <typename M>
__device__ __forceinline__ M min_of(M a, M b) {
  return b < a ? b : a;
}
template <typename M>
__device__ __forceinline__ M max_of(M a, M b) {
  return b > a ? b : a;
}

// Reduces over the `team` consecutive lanes (a power of two <= 32, aligned) of a warp;
// every lane of the team gets the result.
template <typename M, typename C>
__device__ __forceinline__ M team_reduce(M v, int team, C combine) {
  for (int off = team / 2; off > 0; off /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace qg::cuda
