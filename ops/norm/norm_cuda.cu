// batch_norm and layer_norm on the GPU, deterministic (fixed thread assignment and block
// tree order, no float atomics) and with no host synchronisation: batch_norm's `frozen`
// flag is read on the device. Statistics are f64 sums and sums of squares, as on the CPU,
// so the two backends agree to summation order.
//   batch_norm:  partial sums per (channel, stretch of its N*S values) -> per-channel
//                finalize (mean, invstd, running-stat update, used flag) -> element-wise y.
//   channel_div: element-wise; its backward writes dx and the per-channel sums in one pass.
//   layer_norm:  one block per row; dgamma/dbeta as per-chunk column partials, then a fold
//                over the chunks in order.
#include <algorithm>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/norm/norm_cpu.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

__device__ double2 add2(double2 a, double2 b) {
  return make_double2(a.x + b.x, a.y + b.y);
}

struct ChannelDims {
  int64_t n, c, s, m, per_split;
  int splits;
};

ChannelDims channel_dims(const Shape& x) {
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

template <typename T>
__global__ void bn_stats_kernel(const T* __restrict__ x, const float* frozen, ChannelDims d,
                                double2* partial) {
  if (*frozen != 0.0f) return;  // running statistics: nothing to reduce
  stretch_sums(
      d, partial, [&](int64_t i) { return x[i]; },
      [](int64_t, int64_t, T xv) {
        const double v = static_cast<double>(xv);
        return make_double2(v, v * v);
      });
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
      var = var > 0 ? var : 0.0;
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

template <typename T>
__global__ void bn_apply_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                const T* __restrict__ beta, const T* __restrict__ mean,
                                const T* __restrict__ invstd, ChannelDims d, T* __restrict__ y) {
  for_each_channel_element(
      d, [&](int64_t i) { return x[i]; },
      [&](int64_t i, int64_t ch, T xv) {
        y[i] = (xv - mean[ch]) * invstd[ch] * gamma[ch] + beta[ch];
      });
}

template <typename T>
__global__ void bn_grad_stats_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const T* __restrict__ mean, const T* __restrict__ invstd,
                                     ChannelDims d, double2* partial) {
  const T m = mean[blockIdx.y], is = invstd[blockIdx.y];
  stretch_sums(
      d, partial, [&](int64_t i) { return make_pair2(dy[i], x[i]); },
      [&](int64_t, int64_t, Pair2<T> v) {
        const double g = static_cast<double>(v.a);
        return make_double2(g, g * static_cast<double>((v.b - m) * is));
      });
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
__global__ void bn_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                             const T* __restrict__ mean, const T* __restrict__ invstd,
                             const T* __restrict__ coef, ChannelDims d, T* __restrict__ dx) {
  for_each_channel_element(
      d, [&](int64_t i) { return make_pair2(dy[i], x[i]); },
      [&](int64_t i, int64_t ch, Pair2<T> v) {
        T xhat = (v.b - mean[ch]) * invstd[ch];
        dx[i] = coef[3 * ch] * (v.a - coef[3 * ch + 1] - xhat * coef[3 * ch + 2]);
      });
}

template <typename T>
void batch_norm_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  ChannelDims d = channel_dims(x.shape());
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (ctx.training)
    QG_CHECK(d.m > 1, ctx.op, "expected more than 1 value per channel when training, got input ",
             x.str());
  QG_CHECK(ctx.inputs[3].is_contiguous() && ctx.inputs[4].is_contiguous(), ctx.op,
           "running_mean and running_var must be contiguous (they are updated in place)");
  const float* frozen = in_ptr<float>(ctx.states[0]);
  Tensor partial;
  if (ctx.training && d.c > 0 && d.m > 0) {
    partial = Tensor::empty({d.c * d.splits * 2}, DType::f64, x.device());
    bn_stats_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, s>>>(
        in_ptr<T>(x), frozen, d, out_ptr<double2>(partial));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
  auto fin = elementwise_launch(std::max<int64_t>(d.c, 1));
  bn_finalize_kernel<T><<<fin.blocks, fin.threads, 0, s>>>(
      partial.defined() ? in_ptr<double2>(partial) : nullptr, frozen, ctx.training, d,
      ctx.attrs.get_real("eps"), ctx.attrs.get_real("momentum"), out_ptr<T>(ctx.inputs[3]),
      out_ptr<T>(ctx.inputs[4]), out_ptr<T>(ctx.outputs[1]), out_ptr<T>(ctx.outputs[2]),
      out_ptr<T>(ctx.outputs[3]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const int64_t total = x.numel();
  if (total == 0) return;
  auto app = elementwise_launch(total);
  bn_apply_kernel<T><<<app.blocks, app.threads, 0, s>>>(
      in_ptr<T>(x), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]), in_ptr<T>(ctx.outputs[1]),
      in_ptr<T>(ctx.outputs[2]), d, out_ptr<T>(ctx.outputs[0]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void batch_norm_backward_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  ChannelDims d = channel_dims(x.shape());
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (d.c == 0) return;
  Tensor partial = Tensor::empty({d.c * d.splits * 2}, DType::f64, x.device());
  Tensor coef = Tensor::empty({d.c * 3}, x.dtype(), x.device());
  const T* mean = in_ptr<T>(ctx.inputs[3]);
  const T* invstd = in_ptr<T>(ctx.inputs[4]);
  if (d.m > 0) {
    bn_grad_stats_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, s>>>(
        in_ptr<T>(ctx.inputs[0]), in_ptr<T>(x), mean, invstd, d, out_ptr<double2>(partial));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  } else {
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(partial.raw_data(), 0, partial.nbytes(), s));
  }
  auto fin = elementwise_launch(d.c);
  bn_grad_finalize_kernel<T><<<fin.blocks, fin.threads, 0, s>>>(
      in_ptr<double2>(partial), in_ptr<T>(ctx.inputs[2]), invstd, in_ptr<T>(ctx.inputs[5]), d,
      out_ptr<T>(ctx.outputs[1]), out_ptr<T>(ctx.outputs[2]), out_ptr<T>(coef));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  const int64_t total = x.numel();
  if (total == 0) return;
  auto app = elementwise_launch(total);
  bn_dx_kernel<T><<<app.blocks, app.threads, 0, s>>>(in_ptr<T>(ctx.inputs[0]), in_ptr<T>(x), mean,
                                                     invstd, in_ptr<T>(coef), d,
                                                     out_ptr<T>(ctx.outputs[0]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

// channel_div (ops/norm/channel_div_ops.cpp): y = x / s[c], and its backward in one pass
// over dy and y: dx per element and per-(stretch, channel) partial sums of dx * y, folded in
// stretch order (dx and dx * y rounded in T as on the CPU; the sum in f64).
template <typename T>
__global__ void channel_div_kernel(const T* __restrict__ x, const T* __restrict__ s, ChannelDims d,
                                   T* __restrict__ y) {
  for_each_channel_element(
      d, [&](int64_t i) { return x[i]; }, [&](int64_t i, int64_t ch, T xv) { y[i] = xv / s[ch]; });
}

template <typename T>
__global__ void channel_div_grad_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                        const T* __restrict__ s, ChannelDims d, T* __restrict__ dx,
                                        double2* partial) {
  const T sc = s[blockIdx.y];
  stretch_sums(
      d, partial, [&](int64_t i) { return make_pair2(dy[i], y[i]); },
      [&](int64_t, int64_t i, Pair2<T> v) {
        const T g = v.a / sc;
        dx[i] = g;
        const T product = g * v.b;
        return make_double2(static_cast<double>(product), 0.0);
      });
}

template <typename T>
__global__ void channel_div_fold_kernel(const double2* partial, ChannelDims d, T* ds) {
  for (int64_t ch = global_thread(); ch < d.c; ch += global_stride()) {
    double sum = 0;
    for (int i = 0; i < d.splits; ++i) sum += partial[ch * d.splits + i].x;
    ds[ch] = -T(sum);
  }
}

template <typename T>
void channel_div_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0) return;
  ChannelDims d = channel_dims(x.shape());
  auto app = elementwise_launch(x.numel());
  channel_div_kernel<T><<<app.blocks, app.threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
      in_ptr<T>(x), in_ptr<T>(ctx.inputs[1]), d, out_ptr<T>(ctx.outputs[0]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void channel_div_backward_cuda(KernelContext& ctx) {
  const Tensor& y = ctx.inputs[1];
  ChannelDims d = channel_dims(y.shape());
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (d.c == 0) return;
  if (d.m == 0) {  // no elements: ds is an empty sum
    QG_CUDA_CHECK(ctx.op,
                  cudaMemsetAsync(ctx.outputs[1].raw_data(), 0, ctx.outputs[1].nbytes(), s));
    return;
  }
  QG_CHECK(d.c <= 65535, ctx.op, "at most 65535 channels (one grid row each), got ", y.str());
  Tensor partial = Tensor::empty({d.c * d.splits * 2}, DType::f64, y.device());
  channel_div_grad_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, s>>>(
      in_ptr<T>(ctx.inputs[0]), in_ptr<T>(y), in_ptr<T>(ctx.inputs[2]), d,
      out_ptr<T>(ctx.outputs[0]), out_ptr<double2>(partial));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  auto fin = elementwise_launch(d.c);
  channel_div_fold_kernel<T>
      <<<fin.blocks, fin.threads, 0, s>>>(in_ptr<double2>(partial), d, out_ptr<T>(ctx.outputs[1]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
__global__ void ln_forward_kernel(const T* x, const T* gamma, const T* beta, int64_t rows,
                                  int64_t dim, double eps, T* y, T* mean_out, T* rstd_out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = x + r * dim;
    double2 acc = make_double2(0, 0);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      double v = static_cast<double>(p[j]);
      acc = add2(acc, make_double2(v, v * v));
    }
    acc = block_reduce(acc, add2);
    const double mean = acc.x / dim;
    double var = acc.y / dim - mean * mean;
    var = var > 0 ? var : 0.0;
    const double rstd = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean_out[r] = T(mean);
      rstd_out[r] = T(rstd);
    }
    const T mu = T(mean), rs = T(rstd);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      y[r * dim + j] = (p[j] - mu) * rs * gamma[j] + beta[j];
  }
}

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

constexpr int64_t kRowsPerChunk = 64;

// Column partials of dgamma (y) and dbeta (x) over one chunk of rows.
template <typename T>
__global__ void ln_param_partial_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                        int64_t rows, int64_t dim, double2* partial) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = blockIdx.y * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  double2 acc = make_double2(0, 0);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * dim + j;
    T xhat = (x[i] - mean[r]) * rstd[r];
    acc = add2(acc, make_double2(static_cast<double>(dy[i]), static_cast<double>(dy[i] * xhat)));
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

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, 1 << 20)));
}

template <typename T>
void layer_norm_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t dim = x.shape().back(), rows = x.numel() / dim;
  if (rows == 0) return;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  ln_forward_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(
      in_ptr<T>(x), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]), rows, dim,
      ctx.attrs.get_real("eps"), out_ptr<T>(ctx.outputs[0]), out_ptr<T>(ctx.outputs[1]),
      out_ptr<T>(ctx.outputs[2]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void layer_norm_backward_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  const int64_t dim = x.shape().back(), rows = x.numel() / dim;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (rows == 0) {
    for (int o = 1; o <= 2; ++o)
      QG_CUDA_CHECK(ctx.op,
                    cudaMemsetAsync(ctx.outputs[o].raw_data(), 0, ctx.outputs[o].nbytes(), s));
    return;
  }
  const T *dy = in_ptr<T>(ctx.inputs[0]), *xp = in_ptr<T>(x);
  const T *mean = in_ptr<T>(ctx.inputs[3]), *rstd = in_ptr<T>(ctx.inputs[4]);
  ln_dx_kernel<T><<<row_blocks(rows), kThreads, 0, s>>>(
      dy, xp, in_ptr<T>(ctx.inputs[2]), mean, rstd, rows, dim, out_ptr<T>(ctx.outputs[0]));
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

// The kernel of `fn`'s op in the dtype of input 0.
template <typename Fn>
KernelFn f32_f64(Fn fn) {
  return [fn](KernelContext& ctx) {
    dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) { fn(tag, ctx); });
  };
}

}  // namespace

void add_norm_cuda_kernels(OpRegistry& r) {
  const std::vector<DType> types = {DType::f32, DType::f64};
  auto add = [&](const char* op, KernelFn fn) {
    r.get_mutable(op).kernels.push_back({DeviceType::cuda, types, std::move(fn)});
  };
  add("batch_norm", f32_f64([](auto tag, KernelContext& c) { batch_norm_cuda<decltype(tag)>(c); }));
  add("batch_norm_backward",
      f32_f64([](auto tag, KernelContext& c) { batch_norm_backward_cuda<decltype(tag)>(c); }));
  add("layer_norm", f32_f64([](auto tag, KernelContext& c) { layer_norm_cuda<decltype(tag)>(c); }));
  add("layer_norm_backward",
      f32_f64([](auto tag, KernelContext& c) { layer_norm_backward_cuda<decltype(tag)>(c); }));
  add("channel_div",
      f32_f64([](auto tag, KernelContext& c) { channel_div_cuda<decltype(tag)>(c); }));
  add("channel_div_backward",
      f32_f64([](auto tag, KernelContext& c) { channel_div_backward_cuda<decltype(tag)>(c); }));
}

}  // namespace qg
