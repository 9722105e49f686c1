// layer_norm_backward on the GPU, shared by the plain op (norm_cuda.cu) and the fused
// ste_backward + layer_norm_backward node (ops/fused): the kernels read the incoming
// gradient through `DyOf`, an accessor dy(i) that is either the tensor itself or the STE
// mask applied on load. Both forms run the same kernels with the same launch shapes, so
// the fused node's outputs are bit-identical to ste_backward followed by the plain op.
//   dx:            one block per row, the row's two f64 sums, then the element-wise dx;
//   dgamma, dbeta: per-chunk column partials (kRowsPerChunk rows), then a fold over the
//                  chunks in order (deterministic, no atomics).
#pragma once

#include <algorithm>

#include "core/graph.h"
#include "ops/norm/channel_cuda.cuh"

namespace qg::norm_cuda {

// The plain incoming gradient.
template <typename T>
struct PlainDy {
  const T* dy;
  __device__ __forceinline__ T operator()(int64_t i) const { return dy[i]; }
};

// ste_backward's output, computed where it is read: dy where the mask bit of element i is
// set, else +0 (bit i % 8 of mask byte i / 8, as ste_backward stores and reads it).
template <typename T>
struct MaskedDy {
  const T* dy;
  const uint8_t* mask;
  __device__ __forceinline__ T operator()(int64_t i) const {
    return ((mask[i >> 3] >> (i & 7)) & 1u) ? dy[i] : T(0);
  }
};

template <typename T, typename DyOf>
__global__ void ln_dx_kernel(DyOf dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                             int64_t rows, int64_t dim, T* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T mu = mean[r], rs = rstd[r];
    double2 acc = make_double2(0, 0);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t i = r * dim + j;
      T xhat = (x[i] - mu) * rs;
      double g = static_cast<double>(dy(i) * gamma[j]);
      acc = add2(acc, make_double2(g, g * static_cast<double>(xhat)));
    }
    acc = block_reduce(acc, add2);
    const T mean_g = T(acc.x / dim), mean_g_xhat = T(acc.y / dim);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const int64_t i = r * dim + j;
      T xhat = (x[i] - mu) * rs;
      dx[i] = rs * (dy(i) * gamma[j] - mean_g - xhat * mean_g_xhat);
    }
  }
}

constexpr int64_t kRowsPerChunk = 64;

// Column partials of dgamma (y) and dbeta (x) over one chunk of rows.
template <typename T, typename DyOf>
__global__ void ln_param_partial_kernel(DyOf dy, const T* x, const T* mean, const T* rstd,
                                        int64_t rows, int64_t dim, double2* partial) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = blockIdx.y * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  double2 acc = make_double2(0, 0);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * dim + j;
    T xhat = (x[i] - mean[r]) * rstd[r];
    const T d = dy(i);
    acc = add2(acc, make_double2(static_cast<double>(d), static_cast<double>(d * xhat)));
  }
  partial[blockIdx.y * dim + j] = acc;
}

template <typename T>
__global__ void ln_param_fold_kernel(const double2* partial, int64_t chunks, int64_t dim, T* dgamma,
                                     T* dbeta) {
  for (int64_t j = global_thread(); j < dim; j += global_stride()) {
    double2 s = make_double2(0, 0);
    for (int64_t c = 0; c < chunks; ++c) s = add2(s, partial[c * dim + j]);
    dbeta[j] = T(s.x);
    dgamma[j] = T(s.y);
  }
}

inline unsigned ln_row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, 1 << 20)));
}

// {dy, x, gamma, mean, rstd} -> {dx, dgamma, dbeta} with dy read through `dy`; `x_index` is
// the position of x among the context's inputs (gamma, mean and rstd follow it).
template <typename T, typename DyOf>
void layer_norm_backward_launch(KernelContext& ctx, DyOf dy, size_t x_index) {
  const Tensor& x = ctx.inputs.at(x_index);
  const int64_t dim = x.shape().back(), rows = x.numel() / dim;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (rows == 0) {
    for (int o = 1; o <= 2; ++o)
      QG_CUDA_CHECK(ctx.op,
                    cudaMemsetAsync(ctx.outputs[o].raw_data(), 0, ctx.outputs[o].nbytes(), s));
    return;
  }
  const T* xp = in_ptr<T>(x);
  const T* gamma = in_ptr<T>(ctx.inputs.at(x_index + 1));
  const T* mean = in_ptr<T>(ctx.inputs.at(x_index + 2));
  const T* rstd = in_ptr<T>(ctx.inputs.at(x_index + 3));
  ln_dx_kernel<T><<<ln_row_blocks(rows), kThreads, 0, s>>>(dy, xp, gamma, mean, rstd, rows, dim,
                                                           out_ptr<T>(ctx.outputs[0]));
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
