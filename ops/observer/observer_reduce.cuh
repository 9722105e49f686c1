// The batch statistics pass shared by the CUDA observers (minmax, moving average,
// histogram): blocks reduce fixed stretches of one channel's elements to (min, max,
// nonfinite count) partials, which one thread per channel folds afterwards. Min and max use
// the CPU's order-independent ordered_min/max, so any fixed reduction order gives the CPU's
// result, signed zeros included.
#pragma once

#include "ops/common/cuda_common.cuh"
#include "ops/observer/observer_math.h"

namespace qg::cuda {

struct Part {
  float mn, mx;  // +inf / -inf when the stretch has no finite value
  unsigned long long nonfinite;
};

__device__ __forceinline__ Part identity_part() {
  return {INFINITY, -INFINITY, 0ull};
}

struct CombineParts {
  __device__ Part operator()(Part a, Part b) const {
    return {obsmath::ordered_min(a.mn, b.mn), obsmath::ordered_max(a.mx, b.mx),
            a.nonfinite + b.nonfinite};
  }
};

struct ObserveArgs {
  ScopeDims d;
  int64_t per_q;  // elements per channel (all of them per tensor)
  int64_t splits, chunk;
  const uint8_t* enabled;
};

// Channels along the last axis of an [outer, C] tensor (inner == 1, e.g. per-feature
// statistics of activations): a channel's elements are C apart, so the partials come from
// row tiles read with whole rows in flight (observe_columns_kernel) instead.
__host__ __device__ inline bool column_layout(const ScopeDims& d) {
  return d.kind == ScopeKind::channel && d.inner == 1 && d.outer > 1;
}

constexpr int kColumnLanes = 32;  // consecutive channels per block: one 128-byte f32 line

// Host side: the split of each channel over blocks for `threads`-thread blocks.
inline ObserveArgs observe_args(const ScopeLayout& l, const uint8_t* enabled, int threads) {
  ObserveArgs a{scope_dims(l), 0, 1, 1, enabled};
  a.per_q = elements_per_qparam(a.d);
  if (column_layout(a.d)) {
    // Row tiles: enough blocks to fill the device 16 times over (each thread has only a few
    // 4-byte loads in flight, so many blocks must be resident), each tile at least
    // `threads` rows.
    int64_t column_blocks = (a.d.axis_len + kColumnLanes - 1) / kColumnLanes;
    int64_t want = (16 * int64_t{multiprocessor_count()} + column_blocks - 1) / column_blocks;
    int64_t by_rows = (a.d.outer + threads - 1) / threads;
    a.splits = want < by_rows ? want : by_rows;
    if (a.splits < 1) a.splits = 1;
    a.chunk = (a.d.outer + a.splits - 1) / a.splits;
    return a;
  }
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, threads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  return a;
}

// partial[q * splits + tile] for the column layout: block (blockIdx.x, blockIdx.y) covers
// channels [32 * blockIdx.x, +32) over rows [chunk * blockIdx.y, +chunk); lane = channel,
// warp = row stride, so every warp load is one contiguous stretch of a row.
template <typename T>
__global__ void observe_columns_kernel(const T* x, ObserveArgs a, Part* partial) {
  __shared__ Part warps[32][kColumnLanes];
  if (*a.enabled == 0) return;
  const int lane = threadIdx.x % kColumnLanes, warp = threadIdx.x / kColumnLanes;
  const int nwarps = blockDim.x / kColumnLanes;
  const int64_t C = a.d.axis_len;
  const int64_t q = int64_t{blockIdx.x} * kColumnLanes + lane;
  const int64_t r0 = int64_t{blockIdx.y} * a.chunk;
  const int64_t r1 = r0 + a.chunk < a.d.outer ? r0 + a.chunk : a.d.outer;
  Part p = identity_part();
  constexpr int kInFlight = 8;  // independent row loads per thread before any is used
  if (q < C)
    for (int64_t r = r0 + warp; r < r1; r += kInFlight * nwarps) {
      float v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        int64_t rr = r + int64_t{u} * nwarps;
        v[u] = rr < r1 ? static_cast<float>(to_math(x[rr * C + q])) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (r + int64_t{u} * nwarps >= r1) break;
        if (!qmath::is_finite(v[u])) {
          ++p.nonfinite;
          continue;
        }
        p.mn = obsmath::ordered_min(p.mn, v[u]);
        p.mx = obsmath::ordered_max(p.mx, v[u]);
      }
    }
  warps[warp][lane] = p;
  __syncthreads();
  if (warp == 0 && q < C) {
    for (int w = 1; w < nwarps; ++w) p = CombineParts{}(p, warps[w][lane]);
    partial[q * a.splits + blockIdx.y] = p;
  }
}

// partial[q * splits + s] = the statistics of stretch s of channel q.
template <typename T>
__global__ void observe_partial_kernel(const T* x, ObserveArgs a, Part* partial) {
  if (*a.enabled == 0) return;
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    Part p = identity_part();
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, r, k)) break;
      float v = static_cast<float>(to_math(x[k]));  // the f32 statistics, as on the CPU
      if (!qmath::is_finite(v)) {
        ++p.nonfinite;
        continue;
      }
      p.mn = obsmath::ordered_min(p.mn, v);
      p.mx = obsmath::ordered_max(p.mx, v);
    }
    Part total = block_reduce(p, CombineParts{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

// Launches observe_partial_kernel over x into a fresh partial buffer it returns.
inline Tensor launch_observe_partials(const std::string& op, const Tensor& x, const ObserveArgs& a,
                                      int threads, cudaStream_t s) {
  const int64_t blocks = a.d.num_qparams * a.splits;
  Tensor partial =
      Tensor::empty({blocks * static_cast<int64_t>(sizeof(Part))}, DType::u8, x.device());
  unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (column_layout(a.d)) {
      dim3 cgrid(static_cast<unsigned>((a.d.axis_len + kColumnLanes - 1) / kColumnLanes),
                 static_cast<unsigned>(a.splits));
      observe_columns_kernel<T><<<cgrid, threads, 0, s>>>(in_ptr<T>(x), a, out_ptr<Part>(partial));
    } else {
      observe_partial_kernel<T><<<grid, threads, 0, s>>>(in_ptr<T>(x), a, out_ptr<Part>(partial));
    }
    QG_CUDA_CHECK_LAUNCH(op);
  });
  return partial;
}

}  // namespace qg::cuda
