// layer_norm_backward on the GPU, and the warp-per-row launch helpers the forward shares
// (included by norm_cuda.cu, kept apart for its size):
//   dx:            f32 rows of up to 1024 elements: one warp per row, the row's dy * gamma
//                  and xhat kept in registers between its two f64 sums (warp shuffles) and
//                  the element-wise dx, so dy and x are read once; other rows: one block
//                  per row, reading them twice;
//   dgamma, dbeta: per-chunk column partials (kRowsPerChunk rows), then a fold over the
//                  chunks in order (deterministic, no atomics).
// Why the warp kernel and the unrolled fold: with one block per row and a fold that waits
// on each chunk's load in turn, an H200 took 57 us per f32[8, 512, 768]
// layer_norm_backward, about 5x its bytes at copy speed.
#pragma once

#include <algorithm>
#include <type_traits>

#include "core/graph.h"
#include "ops/norm/channel_cuda.cuh"

namespace qg::norm_cuda {

template <typename T>
__global__ void ln_dx_kernel(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                             int64_t rows, int64_t dim, T* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T mu = mean[r], rs = rstd[r];
    double2 acc = make_double2(0, 0);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t i = r * dim + j;
      T xhat = (x[i] - mu) * rs;
      double g = static_cast<double>(dy[i] * gamma[j]);
      acc = add2(acc, make_double2(g, g * static_cast<double>(xhat)));
    }
    acc = block_reduce(acc, add2);
    const T mean_g = T(acc.x / dim), mean_g_xhat = T(acc.y / dim);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t i = r * dim + j;
      T xhat = (x[i] - mu) * rs;
      dx[i] = rs * (dy[i] * gamma[j] - mean_g - xhat * mean_g_xhat);
    }
  }
}

// f32 rows of up to kWarpRowMax elements go to the warp-per-row kernels (forward and
// backward): element j in lane j % 32, slot j / 32.
constexpr int64_t kWarpRowMax = 1024;

// Calls fn(std::integral_constant<int, K>{}) with the slots per lane rows of `dim` need.
template <typename Fn>
void with_row_slots(int64_t dim, Fn fn) {
  if (dim <= 256)
    fn(std::integral_constant<int, 8>{});
  else if (dim <= 512)
    fn(std::integral_constant<int, 16>{});
  else
    fn(std::integral_constant<int, 32>{});
}

// 4 warps a block: the 32-slot form needs ~130 registers, so smaller blocks let 3 share a
// multiprocessor.
constexpr int kWarpRowThreads = 128;

// Rows of up to 32 * K elements (f32): a warp per row, element j of the row in lane j % 32,
// slot j / 32. Per element the same expressions as ln_dx_kernel; the sums are added per lane
// in slot order, then across lanes by a shuffle tree (deterministic).
template <int K>
__global__ void __launch_bounds__(kWarpRowThreads)
    ln_dx_warp_kernel(const float* dy, const float* x, const float* gamma, const float* mean,
                      const float* rstd, int64_t rows, int dim, float* dx) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows; r += warps) {
    const float mu = mean[r], rs = rstd[r];
    float g[K], xhat[K];
    double sum_g = 0, sum_g_xhat = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      if (j < dim) {
        const int64_t i = r * dim + j;
        g[k] = dy[i] * gamma[j];
        xhat[k] = (x[i] - mu) * rs;
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < dim) {
        const double gd = static_cast<double>(g[k]);
        sum_g += gd;
        sum_g_xhat += gd * static_cast<double>(xhat[k]);
      }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      sum_g += __shfl_xor_sync(0xffffffffu, sum_g, off);
      sum_g_xhat += __shfl_xor_sync(0xffffffffu, sum_g_xhat, off);
    }
    const float mean_g = float(sum_g / dim), mean_g_xhat = float(sum_g_xhat / dim);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      if (j < dim) dx[r * dim + j] = rs * (g[k] - mean_g - xhat[k] * mean_g_xhat);
    }
  }
}

// 32 rows a chunk: 384 blocks for [4096, 768] (64 gave 192, too few loads in flight).
constexpr int64_t kRowsPerChunk = 32;

// Column partials of dgamma (y) and dbeta (x) over one chunk of rows.
template <typename T>
__global__ void ln_param_partial_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                        int64_t rows, int64_t dim, double2* partial) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = blockIdx.y * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  double2 acc = make_double2(0, 0);
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * dim + j;
    T xhat = (x[i] - mean[r]) * rstd[r];
    const T d = dy[i];
    acc = add2(acc, make_double2(static_cast<double>(d), static_cast<double>(d * xhat)));
  }
  partial[blockIdx.y * dim + j] = acc;
}

template <typename T>
__global__ void ln_param_fold_kernel(const double2* partial, int64_t chunks, int64_t dim, T* dgamma,
                                     T* dbeta) {
  for (int64_t j = global_thread(); j < dim; j += global_stride()) {
    double2 s = make_double2(0, 0);
    // Unrolled so the loads are issued ahead of the (ordered) adds: one L2 round trip per
    // chunk in sequence made this fold alone ~20 us for 64 chunks.
#pragma unroll 16
    for (int64_t c = 0; c < chunks; ++c) s = add2(s, partial[c * dim + j]);
    dbeta[j] = T(s.x);
    dgamma[j] = T(s.y);
  }
}

inline unsigned ln_row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, 1 << 20)));
}

// Blocks of the warp-per-row kernels: one warp per row (grid-strided past 2^20 blocks).
inline unsigned warp_row_blocks(int64_t rows) {
  return ln_row_blocks((rows + kWarpRowThreads / 32 - 1) / (kWarpRowThreads / 32));
}

// {dy, x, gamma, mean, rstd} -> {dx, dgamma, dbeta}.
template <typename T>
void layer_norm_backward_launch(KernelContext& ctx) {
  const T* dy = in_ptr<T>(ctx.inputs.at(0));
  const Tensor& x = ctx.inputs.at(1);
  const int64_t dim = x.shape().back(), rows = x.numel() / dim;
  auto s = cuda_stream(ctx.device);
  if (rows == 0) {
    for (int o = 1; o <= 2; ++o)
      QG_CUDA_CHECK(ctx.op,
                    cudaMemsetAsync(ctx.outputs[o].raw_data(), 0, ctx.outputs[o].nbytes(), s));
    return;
  }
  const T* xp = in_ptr<T>(x);
  const T* gamma = in_ptr<T>(ctx.inputs.at(2));
  const T* mean = in_ptr<T>(ctx.inputs.at(3));
  const T* rstd = in_ptr<T>(ctx.inputs.at(4));
  T* dx = out_ptr<T>(ctx.outputs[0]);
  if constexpr (std::is_same_v<T, float>) {
    if (dim <= kWarpRowMax) {
      const int d = static_cast<int>(dim);
      with_row_slots(dim, [&](auto slots) {
        constexpr int kSlots = decltype(slots)::value;
        ln_dx_warp_kernel<kSlots><<<warp_row_blocks(rows), kWarpRowThreads, 0, s>>>(
            dy, xp, gamma, mean, rstd, rows, d, dx);
      });
    } else {
      ln_dx_kernel<T>
          <<<ln_row_blocks(rows), kThreads, 0, s>>>(dy, xp, gamma, mean, rstd, rows, dim, dx);
    }
  } else {
    ln_dx_kernel<T>
        <<<ln_row_blocks(rows), kThreads, 0, s>>>(dy, xp, gamma, mean, rstd, rows, dim, dx);
  }
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  QG_CHECK(chunks <= 65535, ctx.op, "too many rows for the column partials: ", x.str());
  Tensor partial = Tensor::empty({chunks * dim * 2}, DType::f64, x.device());
  dim3 grid(static_cast<unsigned>((dim + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  ln_param_partial_kernel<T>
      <<<grid, kThreads, 0, s>>>(dy, xp, mean, rstd, rows, dim, out_ptr<double2>(partial));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  auto fold = elementwise_launch(dim);
  ln_param_fold_kernel<T><<<fold.blocks, fold.threads, 0, s>>>(in_ptr<double2>(partial), chunks,
                                                               dim, out_ptr<T>(ctx.outputs[1]),
                                                               out_ptr<T>(ctx.outputs[2]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace qg::norm_cuda
