// The CUDA permute gathers (ops/shape/shape_cuda.cu), shared with the fused ste_backward +
// permute node (ops/fused/ste_producer/ste_producer_cuda.cu): a strided gather, one thread per
// output element, over the collapsed plan of permute_plan.h (at most kMaxPermuteRank
// dimensions after merging), and for plans that are a (batched) swap of the last two axes, a
// 32 x 32 shared-memory tile transpose so that both the reads and the writes are coalesced.
// Elements move as unsigned integers of their size, so every dtype moves bit for bit. The
// kernels hand each gathered element to a Store functor: PlainStore writes it (permute); the
// fused node's store writes it or +0 by a mask bit, with the same reads and index arithmetic.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/fast_divmod.h"
#include "ops/shape/permute_plan.h"

namespace qg::cuda {

inline constexpr int kMaxPermuteRank = 6;

struct GatherDims {
  int rank;
  int64_t sizes[kMaxPermuteRank];
  int64_t src_strides[kMaxPermuteRank];
  FastDivmod divisors[kMaxPermuteRank];  // of sizes, for 32-bit indices (with_divisors)
};

// g with the divisors of its sizes filled in: call after the last change to g.sizes, before
// a launch with 32-bit indices (every size is then below 2^31).
inline GatherDims with_divisors(GatherDims g) {
  for (int d = 0; d < g.rank; ++d)
    if (g.sizes[d] < (int64_t{1} << 31))
      g.divisors[d] = FastDivmod(static_cast<uint32_t>(g.sizes[d]));
  return g;
}

// The plan as kernel arguments; throws (naming `op`) when it has too many dimensions.
inline GatherDims gather_dims(const std::string& op, const PermutePlan& plan, const Tensor& x) {
  QG_CHECK(plan.sizes.size() <= kMaxPermuteRank, op, "the CUDA kernel gathers at most ",
           kMaxPermuteRank, " dimensions after merging contiguous ones; input ", x.str(), " needs ",
           plan.sizes.size());
  GatherDims g{};
  g.rank = static_cast<int>(plan.sizes.size());
  for (int d = 0; d < g.rank; ++d) {
    g.sizes[d] = plan.sizes[d];
    g.src_strides[d] = plan.src_strides[d];
  }
  return g;
}

// dst[k] = v: the permute itself.
struct PlainStore {
  template <typename E, typename I>
  __device__ __forceinline__ void operator()(E* __restrict__ dst, I k, E v) const {
    dst[k] = v;
  }
};

// Source offset of output element k (or unit k) under g: one division per dimension, a
// multiply-high and a shift for 32-bit indices (FastDivmod). The loop runs over the largest
// rank with compile-time indices, so g stays in the kernel's parameters (a runtime-bounded
// loop indexed g.sizes[d] and copied g to local memory first: 12 STL/LDL per element).
template <typename I>
__device__ __forceinline__ I gather_offset(const GatherDims& g, I k) {
  I rest = k, off = 0;
#pragma unroll
  for (int d = kMaxPermuteRank - 1; d >= 0; --d) {
    if (d >= g.rank) continue;
    const I size = static_cast<I>(g.sizes[d]);
    I q;
    if constexpr (std::is_same_v<I, uint32_t>)
      q = g.divisors[d].div(rest);
    else
      q = rest / size;
    off += (rest - q * size) * static_cast<I>(g.src_strides[d]);
    rest = q;
  }
  return off;
}

// Elements (or units) per thread per grid step, all loaded before any is stored.
inline constexpr int kGatherUnroll = 4;

// I: uint32_t when every element offset fits (with FastDivmod divisions), else int64_t.
template <typename E, typename I, typename Store>
__global__ void permute_gather_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t n64,
                                      GatherDims g, Store store) {
  const I n = static_cast<I>(n64), block = static_cast<I>(blockDim.x);
  const I stride = static_cast<I>(gridDim.x) * block * kGatherUnroll;
  for (I base = static_cast<I>(blockIdx.x) * block * kGatherUnroll + threadIdx.x; base < n;
       base += stride) {
    E v[kGatherUnroll];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const I k = base + u * block;
      if (k < n) v[u] = src[gather_offset(g, k)];
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const I k = base + u * block;
      if (k < n) store(dst, k, v[u]);
    }
  }
}

inline constexpr int kTile = 32, kTileRows = 8;

// out[b] = in[b]^T for `batches` row-major [rows, cols] matrices. Block (32, 8) moves one
// 32 x 32 tile through shared memory (padded by one column against bank conflicts).
template <typename E, typename Store>
__global__ void transpose_tiles_kernel(const E* src, E* dst, int64_t batches, int64_t rows,
                                       int64_t cols, Store store) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
    const E* in = src + b * rows * cols;
    const int64_t out = b * rows * cols;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (c < cols && r < rows) store(dst, out + c * rows + r, tile[threadIdx.x][j]);
    }
    __syncthreads();
  }
}

// A plan {[batches,] cols, rows} reading strides {[rows * cols,] 1, cols} is a batched
// transpose of [rows, cols] matrices. Small matrices stay with the gather.
inline bool as_tiled_transpose(const PermutePlan& p, int64_t& batches, int64_t& rows,
                               int64_t& cols) {
  const size_t r = p.sizes.size();
  if (r < 2 || r > 3) return false;
  cols = p.sizes[r - 2];
  rows = p.sizes[r - 1];
  batches = r == 3 ? p.sizes[0] : 1;
  if (p.src_strides[r - 2] != 1 || p.src_strides[r - 1] != cols) return false;
  if (r == 3 && p.src_strides[0] != rows * cols) return false;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  return rows >= kTile / 2 && cols >= kTile / 2 && row_tiles <= 65535;
}

// Gathers ctx.inputs[0] into ctx.outputs[0] (n elements or units of E) by `plan` (the tile
// transpose when the plan is one, else the gather over g).
template <typename E, typename Store>
void launch_gather(KernelContext& ctx, const PermutePlan& plan, const GatherDims& g, int64_t n,
                   Store store) {
  const auto stream = cuda_stream(ctx.device);
  const E* src = static_cast<const E*>(ctx.inputs[0].raw_data());
  E* dst = static_cast<E*>(ctx.outputs[0].raw_data());
  int64_t batches = 0, rows = 0, cols = 0;
  if (as_tiled_transpose(plan, batches, rows, cols)) {
    dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
              static_cast<unsigned>((rows + kTile - 1) / kTile),
              static_cast<unsigned>(batches < 65535 ? batches : 65535));
    transpose_tiles_kernel<E>
        <<<grid, dim3(kTile, kTileRows), 0, stream>>>(src, dst, batches, rows, cols, store);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    return;
  }
  auto shape = elementwise_launch((n + kGatherUnroll - 1) / kGatherUnroll);
  // 32 bits when every index and every source offset fits: a contiguous input's offsets are
  // below n (a permutation), a strided view's reach its furthest element.
  int64_t furthest = 0;
  for (int d = 0; d < g.rank; ++d) furthest += (g.sizes[d] - 1) * g.src_strides[d];
  if (n < (int64_t{1} << 31) && furthest < (int64_t{1} << 31))
    permute_gather_kernel<E, uint32_t>
        <<<shape.blocks, shape.threads, 0, stream>>>(src, dst, n, with_divisors(g), store);
  else
    permute_gather_kernel<E, int64_t>
        <<<shape.blocks, shape.threads, 0, stream>>>(src, dst, n, g, store);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace qg::cuda
