// Building blocks of the bandwidth-bound quantization kernels (fake_quantize, LSQ, dynamic
// quantize, INT4/NF4 packing): an index type chosen per launch (32-bit arithmetic whenever
// the tensor has fewer than 2^31 elements, since 64-bit division and multiplication cost
// several times more instructions), packs of 8 elements loaded as whole 16-byte
// transactions, a grid-stride loop that keeps two packs in flight per thread, and exact
// (order-independent) min/max reductions over a power-of-two team of lanes.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

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

// Blocks of `threads` threads of `kernel` that one SM holds at once (cached per kernel).
template <typename K>
int resident_blocks_per_sm(const std::string& op, K* kernel, int threads) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int> cache;
  const void* key = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  QG_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  n = n > 0 ? n : 1;
  cache.emplace(key, n);
  return n;
}

// Grid of a grid-stride kernel over `items` (one per thread per trip): no more blocks than
// are resident at once, so every block gets the same share of the work in a single wave
// (a register-heavy kernel that fits 6 blocks per SM would otherwise run a second, mostly
// idle wave).
template <typename K>
unsigned resident_grid(const std::string& op, K* kernel, int threads, int64_t items) {
  int64_t want = (items + threads - 1) / threads;
  int64_t cap = int64_t{resident_blocks_per_sm(op, kernel, threads)} * multiprocessor_count();
  want = want < cap ? want : cap;
  return static_cast<unsigned>(want > 0 ? want : 1);
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

// Grid-stride loop over packs [0, npacks): each thread loads the inputs of two packs
// (load(b)) before processing either (body(b, loaded)), so two loads per thread are in
// flight at a time. Pack b always goes to the same thread for a given launch shape.
template <typename I, typename Load, typename Body>
__device__ __forceinline__ void for_each_pack(I npacks, Load load, Body body) {
  const I stride = thread_stride<I>();
  for (I b0 = thread_index<I>(); b0 < npacks; b0 += 2 * stride) {
    const I b1 = b0 + stride;
    const bool has1 = b1 < npacks;
    auto v0 = load(b0);
    decltype(v0) v1;
    if (has1) v1 = load(b1);
    body(b0, v0);
    if (has1) body(b1, v1);
  }
}

// Flat element k -> qparam index in index type I (the mapping of qparam_of()).
template <typename I>
__device__ __forceinline__ I qparam_index_of(const ScopeDims& d, I k) {
  if (d.kind == ScopeKind::tensor) return 0;
  const I inner = static_cast<I>(d.inner), axis_len = static_cast<I>(d.axis_len);
  const I i = k % inner, t = k / inner;
  const I a = t % axis_len, o = t / axis_len;
  switch (d.kind) {
    case ScopeKind::channel:
      return a;
    case ScopeKind::token:
      return o;
    case ScopeKind::group:
      return (o * static_cast<I>(d.num_groups) + a / static_cast<I>(d.group_size)) * inner + i;
    default:
      return 0;
  }
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
