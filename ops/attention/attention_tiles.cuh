// Pieces the causal attention CUDA kernels share: the tile geometry (32 keys or queries per
// tile, one per lane of a warp; rows per warp chosen so the static shared memory of each
// kernel stays under 48 KiB), tiles staged in shared memory in the storage dtype, warp
// reductions and the explicit fused multiply-add (the build turns off automatic FMA
// contraction, so the kernels ask for it where it is meant).
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/attention/attention_args.h"
#include "ops/attention/attention_strides.h"
#include "ops/common/cuda_common.cuh"

namespace qg::cuda::attention {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 32;  // keys (forward, dq) or queries (dk, dv) per tile: one per lane
constexpr int kSharedLimit = 46 * 1024;

// Row stride of a tile read across lanes (lane l reads row l): one 4-byte word of padding
// (or one element of 8 bytes), so the 32 rows start in 32 different banks.
template <typename T>
constexpr int padded(int hd) {
  return hd + (sizeof(T) >= 4 ? 1 : static_cast<int>(4 / sizeof(T)));
}

// The largest rows per warp (8, 4, 2 or 1) whose per-warp-row arrays (`row_arrays` of
// [rows, hd]) and fixed arrays (`fixed_bytes`) fit kSharedLimit.
template <typename T>
constexpr int rows_per_warp(int hd, int row_arrays, int fixed_bytes) {
  for (int r = 8; r > 1; r /= 2)
    if (fixed_bytes + row_arrays * kWarps * r * hd * static_cast<int>(sizeof(T)) <= kSharedLimit)
      return r;
  return 1;
}

// f64 keeps only one transposed tile in shared memory (two do not fit); the other is read
// from global memory (L1/L2), which is slower but f64 is the checking dtype, not a fast one.
template <typename T>
constexpr bool kTwoTransposed = sizeof(T) <= 4;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

template <typename M>
__device__ __forceinline__ M minus_infinity() {
  return static_cast<M>(-INFINITY);
}

template <typename M>
__device__ __forceinline__ M madd(M a, M b, M c) {
  return fma(a, b, c);
}

template <typename M>
__device__ __forceinline__ M warp_max(M v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

template <typename M>
__device__ __forceinline__ M warp_sum(M v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Copies rows [row0, row0 + rows) of a [seq, hd] matrix whose rows lie `src_stride` elements
// apart into a shared tile of stride `stride`, zero past seq. Every thread of the block takes
// part.
template <typename T>
__device__ __forceinline__ void stage(T* tile, int stride, const T* src, int64_t src_stride,
                                      int64_t row0, int rows, int hd, int64_t seq) {
  const T zero = from_math<T>(math_of<T>(0));
  for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
    const int r = e / hd, c = e % hd;
    tile[r * stride + c] = row0 + r < seq ? src[(row0 + r) * src_stride + c] : zero;
  }
}

// The layout a kernel needs, by value. The outputs are contiguous: rows of o, lse and dq are
// (batch * heads + h) * seq + i, rows of dk and dv (batch * kv_heads + g) * seq + j. The
// inputs' rows lie where their strides say (attention_strides.h); query head h reads KV head
// h / group.
template <typename M>
struct Dims {
  int64_t heads, kv_heads, seq, group;
  M scale;
  AttentionStrides in;
  // Row 0 of (batch, head) bh = batch * heads + head of a query-shaped input (q, o, do, lse).
  __device__ int64_t query_base(const RowStrides& s, int64_t bh) const {
    return s.at(bh / heads, bh % heads, 0);
  }
  // Row i of the same.
  __device__ int64_t query_row(const RowStrides& s, int64_t bh, int64_t i) const {
    return s.at(bh / heads, bh % heads, i);
  }
  // Row 0 of the KV head that query (batch, head) bh reads, in k or v.
  __device__ int64_t kv_base_of_query(const RowStrides& s, int64_t bh) const {
    return s.at(bh / heads, (bh % heads) / group, 0);
  }
  // Row 0 of (batch, KV head) kvh = batch * kv_heads + g of k or v.
  __device__ int64_t kv_base(const RowStrides& s, int64_t kvh) const {
    return s.at(kvh / kv_heads, kvh % kv_heads, 0);
  }
};

template <typename M>
Dims<M> attention_dims(const AttentionLayout& a, const AttentionStrides& in) {
  return {a.heads, a.kv_heads, a.seq, a.group(), static_cast<M>(a.scale), in};
}

}  // namespace qg::cuda::attention
