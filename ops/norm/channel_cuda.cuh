// Per-channel machinery shared by the batch-norm / channel_div CUDA kernels (norm_cuda.cu)
// and their fused form (channel_div_bn_cuda.cu): the launch dimensions, the stretch-sum and
// per-element walks, the per-channel finalize kernels, and the per-element expressions of
// batch_norm's y and dx. The fused kernels are bit-identical to the unfused ones because they
// use these same pieces with the same launch shapes (and nvcc runs with --fmad=false, so an
// expression rounds the same wherever it is compiled).
#pragma once

#include <algorithm>

#include "ops/common/cuda_common.cuh"
#include "ops/norm/norm_cpu.h"

namespace qg::norm_cuda {

using namespace cuda;

constexpr int kThreads = 256;

__device__ inline double2 add2(double2 a, double2 b) {
  return make_double2(a.x + b.x, a.y + b.y);
}

struct ChannelDims {
  int64_t n, c, s, m, per_split;
  int splits;
};

inline ChannelDims channel_dims(const Shape& x) {
  norm::ChannelLayout l = norm::channel_layout(x);
  ChannelDims d{l.n, l.c, l.s, l.n * l.s, 0, 1};
  // Enough (channel, stretch) blocks of kThreads to fill every SM (8 x 256 threads each).
  int64_t want = (8 * multiprocessor_count() + l.c - 1) / std::max<int64_t>(l.c, 1);
  int64_t by_size = (d.m + kThreads * 8 - 1) / (kThreads * 8);
  d.splits = static_cast<int>(std::max<int64_t>(1, std::min({want, by_size, int64_t{65535}})));
  d.per_split = (d.m + d.splits - 1) / d.splits;
  return d;
}

// Two values loaded together by a reduction's load step.
template <typename T>
struct Pair2 {
  T a, b;
};
template <typename T>
__device__ __forceinline__ Pair2<T> make_pair2(T a, T b) {
  return {a, b};
}

// Per (stretch, channel): the sum of use(channel, offset, load(offset)) over the stretch's
// elements, two components, into partial. A stretch is a range of the channel's N * S values
// (image-major); it is walked one image plane at a time, so the threads read contiguous elements
// and the index arithmetic costs one division per plane, not per element.
template <typename Load, typename Use>
__device__ void stretch_sums(const ChannelDims& d, double2* partial, Load load, Use use) {
  const int64_t ch = blockIdx.y, begin = blockIdx.x * d.per_split;
  const int64_t end = begin + d.per_split < d.m ? begin + d.per_split : d.m;
  double2 acc = make_double2(0, 0);
  const int64_t step = blockDim.x;
  for (int64_t k = begin; k < end;) {
    const int64_t image = k / d.s, plane_end = (image + 1) * d.s < end ? (image + 1) * d.s : end;
    const int64_t shift = (image * d.c + ch) * d.s - image * d.s;  // x offset of value k
    int64_t kk = k + threadIdx.x;
    // Four elements per iteration, all loaded before any is used, so four loads are in
    // flight per thread: one at a time (or loads held behind a division's slow-path branch)
    // left these reductions latency-bound at about half the copy bandwidth. The order of
    // the f64 sum is still fixed by the launch shape.
    for (; kk + 3 * step < plane_end; kk += 4 * step) {
      const int64_t i = shift + kk;
      const auto v0 = load(i), v1 = load(i + step), v2 = load(i + 2 * step),
                 v3 = load(i + 3 * step);
      const double2 a = use(ch, i, v0), b = use(ch, i + step, v1);
      const double2 c = use(ch, i + 2 * step, v2), e = use(ch, i + 3 * step, v3);
      acc = add2(acc, add2(add2(a, b), add2(c, e)));
    }
    for (; kk < plane_end; kk += step) acc = add2(acc, use(ch, shift + kk, load(shift + kk)));
    k = plane_end;
  }
  acc = block_reduce(acc, add2);
  if (threadIdx.x == 0) partial[ch * d.splits + blockIdx.x] = acc;
}

// Calls body(i, load(i)) for every element i of the block's stretch (blockIdx.y the channel,
// blockIdx.x the stretch): stretch_sums' walk without the sums, for element-wise kernels
// that set up per-channel constants once per thread.
template <typename Load, typename Body>
__device__ void stretch_each(const ChannelDims& d, Load load, Body body) {
  const int64_t ch = blockIdx.y, begin = blockIdx.x * d.per_split;
  const int64_t end = begin + d.per_split < d.m ? begin + d.per_split : d.m;
  const int64_t step = blockDim.x;
  for (int64_t k = begin; k < end;) {
    const int64_t image = k / d.s, plane_end = (image + 1) * d.s < end ? (image + 1) * d.s : end;
    const int64_t shift = (image * d.c + ch) * d.s - image * d.s;
    int64_t kk = k + threadIdx.x;
    for (; kk + 3 * step < plane_end; kk += 4 * step) {
      const int64_t i = shift + kk;
      const auto v0 = load(i), v1 = load(i + step), v2 = load(i + 2 * step),
                 v3 = load(i + 3 * step);
      body(i, v0);
      body(i + step, v1);
      body(i + 2 * step, v2);
      body(i + 3 * step, v3);
    }
    for (; kk < plane_end; kk += step) body(shift + kk, load(shift + kk));
    k = plane_end;
  }
}

// Calls f(i, ch) for every element i of x (channel ch): per image plane when planes are
// long enough to occupy a block, else flat over the elements.
constexpr int64_t kPlaneMin = 128;
template <typename Load, typename Body>
__device__ void for_each_channel_element(const ChannelDims& d, Load load, Body body) {
  if (d.s >= kPlaneMin) {
    const int64_t step = blockDim.x;
    for (int64_t plane = blockIdx.x; plane < d.n * d.c; plane += gridDim.x) {
      const int64_t ch = plane % d.c, base = plane * d.s;
      int64_t i = threadIdx.x;
      // Four elements loaded before any is written (as in stretch_sums): four loads in flight.
      for (; i + 3 * step < d.s; i += 4 * step) {
        const int64_t k = base + i;
        const auto v0 = load(k), v1 = load(k + step), v2 = load(k + 2 * step),
                   v3 = load(k + 3 * step);
        body(k, ch, v0);
        body(k + step, ch, v1);
        body(k + 2 * step, ch, v2);
        body(k + 3 * step, ch, v3);
      }
      for (; i < d.s; i += step) body(base + i, ch, load(base + i));
    }
  } else {
    for (int64_t i = global_thread(); i < d.n * d.c * d.s; i += global_stride())
      body(i, (i / d.s) % d.c, load(i));
  }
}

// batch_norm's y from x and the channel's saved mean / invstd, gamma, beta (rounded in T).
template <typename T>
__device__ __forceinline__ T bn_normalize(T x, T mean, T invstd, T gamma, T beta) {
  return (x - mean) * invstd * gamma + beta;
}

// batch_norm_backward's dx from dy, x, the channel's mean / invstd and its three dx
// coefficients (bn_grad_finalize_kernel), rounded in T as the CPU rounds it.
template <typename T>
__device__ __forceinline__ T bn_input_grad(T dy, T x, T mean, T invstd, const T* coef) {
  const T xhat = (x - mean) * invstd;
  return coef[0] * (dy - coef[1] - xhat * coef[2]);
}

template <typename T>
__global__ void bn_finalize_kernel(const double2* partial, const float* frozen, bool training,
                                   ChannelDims d, double eps, double momentum, T* running_mean,
                                   T* running_var, T* save_mean, T* save_invstd, T* used) {
  const bool batch = training && *frozen == 0.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *used = batch ? T(1) : T(0);
  for (int64_t ch = global_thread(); ch < d.c; ch += global_stride()) {
    double mean, invstd;
    if (batch) {
      double2 s = make_double2(0, 0);
      for (int i = 0; i < d.splits; ++i) s = add2(s, partial[ch * d.splits + i]);
      const double m = static_cast<double>(d.m);
      mean = s.x / m;
      double var = s.y / m - mean * mean;
      var = var < 0 ? 0.0 : var;  // std::max(var, 0.0) as on the CPU: a NaN variance stays NaN
      invstd = 1.0 / sqrt(var + eps);
      double unbiased = var * m / (m - 1);
      running_mean[ch] = T((1.0 - momentum) * running_mean[ch] + momentum * mean);
      running_var[ch] = T((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    } else {
      mean = static_cast<double>(running_mean[ch]);
      invstd = 1.0 / sqrt(static_cast<double>(running_var[ch]) + eps);
    }
    save_mean[ch] = T(mean);
    save_invstd[ch] = T(invstd);
  }
}

// dbeta, dgamma, and the per-channel coefficients of dx (as the CPU rounds them).
template <typename T>
__global__ void bn_grad_finalize_kernel(const double2* partial, const T* gamma, const T* invstd,
                                        const T* used, ChannelDims d, T* dgamma, T* dbeta,
                                        T* coef) {
  const bool batch = *used != T(0);
  const double m = static_cast<double>(d.m);
  for (int64_t ch = global_thread(); ch < d.c; ch += global_stride()) {
    double2 s = make_double2(0, 0);
    for (int i = 0; i < d.splits; ++i) s = add2(s, partial[ch * d.splits + i]);
    dbeta[ch] = T(s.x);
    dgamma[ch] = T(s.y);
    coef[3 * ch] = T(static_cast<double>(gamma[ch]) * static_cast<double>(invstd[ch]));
    coef[3 * ch + 1] = batch ? T(s.x / m) : T(0);
    coef[3 * ch + 2] = batch ? T(s.y / m) : T(0);
  }
}

template <typename T>
__global__ void channel_div_fold_kernel(const double2* partial, ChannelDims d, T* ds) {
  for (int64_t ch = global_thread(); ch < d.c; ch += global_stride()) {
    double sum = 0;
    for (int i = 0; i < d.splits; ++i) sum += partial[ch * d.splits + i].x;
    ds[ch] = -T(sum);
  }
}

}  // namespace qg::norm_cuda
