// batch_norm and layer_norm on the GPU, deterministic (fixed thread assignment and block
// tree order, no float atomics) and with no host synchronisation: batch_norm's `frozen`
// flag is read on the device. Statistics are f64 sums and sums of squares, as on the CPU,
// so the two backends agree to summation order.
//   batch_norm:  partial sums per (channel, stretch of its N*S values) -> per-channel
//                finalize (mean, invstd, running-stat update, used flag) -> element-wise y.
//   channel_div: element-wise; its backward writes dx and the per-channel sums in one pass.
//   layer_norm:  f32 rows of up to 1024 elements a warp each (the row in registers),
//                longer or f64 rows a block each; the backward in layer_norm_backward_cuda.cuh.
// SyncBatchNorm (DeviceContext::batch_norm_sync, as norm_cpu.cpp): the per-channel f64 sums
// of every rank are added (one NCCL all-reduce) before the finalize kernel, which then sees
// one stretch per channel and the global count. In the backward, dgamma and dbeta keep this
// rank's sums (the gradient sync averages them); the dx coefficients take the global ones.
#include <algorithm>
#include <type_traits>

#include "core/graph.h"
#include "device/communicator.h"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/norm/channel_cuda.cuh"
#include "ops/norm/layer_norm_backward_cuda.cuh"
#include "ops/norm/norm_args.h"

namespace qg {
namespace {

using namespace cuda;
using namespace norm_cuda;

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
__global__ void bn_apply_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                const T* __restrict__ beta, const T* __restrict__ mean,
                                const T* __restrict__ invstd, ChannelDims d, T* __restrict__ y) {
  for_each_channel_element(
      d, [&](int64_t i) { return x[i]; },
      [&](int64_t i, int64_t ch, T xv) {
        y[i] = bn_normalize(xv, mean[ch], invstd[ch], gamma[ch], beta[ch]);
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

template <typename T>
__global__ void bn_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                             const T* __restrict__ mean, const T* __restrict__ invstd,
                             const T* __restrict__ coef, ChannelDims d, T* __restrict__ dx) {
  for_each_channel_element(
      d, [&](int64_t i) { return make_pair2(dy[i], x[i]); },
      [&](int64_t i, int64_t ch, Pair2<T> v) {
        dx[i] = bn_input_grad(v.a, v.b, mean[ch], invstd[ch], coef + 3 * ch);
      });
}

// Per-channel totals of the stretch partials, in stretch order (as the finalize kernels add).
__global__ void bn_collapse_kernel(const double2* partial, ChannelDims d, double2* total) {
  for (int64_t ch = global_thread(); ch < d.c; ch += global_stride()) {
    double2 s = make_double2(0, 0);
    for (int i = 0; i < d.splits; ++i) s = add2(s, partial[ch * d.splits + i]);
    total[ch] = s;
  }
}

// The global batch's per-channel sums in place of the partials: one stretch per channel over
// world x m values. Returns the dims the finalize kernels then read them with.
ChannelDims sync_channel_sums(Communicator& comm, Tensor& partial, ChannelDims d,
                              const Device& device, cudaStream_t s, const std::string& op) {
  Tensor total = Tensor::empty({d.c * 2}, DType::f64, device);
  auto fin = elementwise_launch(d.c);
  bn_collapse_kernel<<<fin.blocks, fin.threads, 0, s>>>(in_ptr<double2>(partial), d,
                                                        out_ptr<double2>(total));
  QG_CUDA_CHECK_LAUNCH(op);
  comm.all_reduce(total.raw_data(), 2 * d.c, DType::f64, ReduceOp::sum, s);
  comm.wait_for(total.raw_data(), s);
  partial = total;
  d.splits = 1;
  d.m *= comm.world_size();
  return d;
}

Communicator* bn_sync(const KernelContext& ctx) {
  Communicator* comm = ctx.device.batch_norm_sync();
  return comm != nullptr && comm->world_size() > 1 ? comm : nullptr;
}

template <typename T>
void batch_norm_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  ChannelDims d = channel_dims(x.shape());
  auto s = cuda_stream(ctx.device);
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
  // With `frozen` set (read on the device) the partials are unused, synced or not; every rank
  // calls the collective either way, as the flag is the same on all of them.
  ChannelDims fd = d;
  if (partial.defined())
    if (Communicator* comm = bn_sync(ctx))
      fd = sync_channel_sums(*comm, partial, d, x.device(), s, ctx.op);
  auto fin = elementwise_launch(std::max<int64_t>(d.c, 1));
  bn_finalize_kernel<T><<<fin.blocks, fin.threads, 0, s>>>(
      partial.defined() ? in_ptr<double2>(partial) : nullptr, frozen, ctx.training, fd,
      ctx.args<NormArgs>().eps, ctx.args<NormArgs>().momentum, out_ptr<T>(ctx.inputs[3]),
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
  auto s = cuda_stream(ctx.device);
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
  if (Communicator* comm = d.m > 0 ? bn_sync(ctx) : nullptr) {
    // The dx coefficients again, from the global sums; dgamma and dbeta stay this rank's.
    ChannelDims gd = sync_channel_sums(*comm, partial, d, x.device(), s, ctx.op);
    Tensor unused = Tensor::empty({2 * d.c}, x.dtype(), x.device());
    bn_grad_finalize_kernel<T><<<fin.blocks, fin.threads, 0, s>>>(
        in_ptr<double2>(partial), in_ptr<T>(ctx.inputs[2]), invstd, in_ptr<T>(ctx.inputs[5]), gd,
        out_ptr<T>(unused), out_ptr<T>(unused) + d.c, out_ptr<T>(coef));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
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
void channel_div_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0) return;
  ChannelDims d = channel_dims(x.shape());
  auto app = elementwise_launch(x.numel());
  channel_div_kernel<T><<<app.blocks, app.threads, 0, cuda_stream(ctx.device)>>>(
      in_ptr<T>(x), in_ptr<T>(ctx.inputs[1]), d, out_ptr<T>(ctx.outputs[0]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void channel_div_backward_cuda(KernelContext& ctx) {
  const Tensor& y = ctx.inputs[1];
  ChannelDims d = channel_dims(y.shape());
  auto s = cuda_stream(ctx.device);
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
    var = var < 0 ? 0.0 : var;  // std::max(var, 0.0) as on the CPU: a NaN variance stays NaN
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

// f32 rows of up to 32 * K elements: a warp per row, the row in registers between its f64
// sums (a shuffle tree) and y, so x is read once and no block barrier is waited on (the
// block-per-row kernel above reads x twice and reduces through shared memory).
template <int K>
__global__ void __launch_bounds__(kWarpRowThreads)
    ln_forward_warp_kernel(const float* x, const float* gamma, const float* beta, int64_t rows,
                           int dim, double eps, float* y, float* mean_out, float* rstd_out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows; r += warps) {
    float v[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < dim) v[k] = x[r * dim + lane + 32 * k];
    double2 acc = make_double2(0, 0);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < dim) {
        const double d = static_cast<double>(v[k]);
        acc = add2(acc, make_double2(d, d * d));
      }
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
      acc = add2(acc, make_double2(__shfl_xor_sync(0xffffffffu, acc.x, off),
                                   __shfl_xor_sync(0xffffffffu, acc.y, off)));
    const double mean = acc.x / dim;
    double var = acc.y / dim - mean * mean;
    var = var < 0 ? 0.0 : var;  // as ln_forward_kernel
    const double rstd = 1.0 / sqrt(var + eps);
    if (lane == 0) {
      mean_out[r] = float(mean);
      rstd_out[r] = float(rstd);
    }
    const float mu = float(mean), rs = float(rstd);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      if (j < dim) y[r * dim + j] = (v[k] - mu) * rs * gamma[j] + beta[j];
    }
  }
}

template <typename T>
void layer_norm_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t dim = x.shape().back(), rows = x.numel() / dim;
  if (rows == 0) return;
  auto s = cuda_stream(ctx.device);
  const T *xp = in_ptr<T>(x), *gamma = in_ptr<T>(ctx.inputs[1]), *beta = in_ptr<T>(ctx.inputs[2]);
  T *y = out_ptr<T>(ctx.outputs[0]), *mean = out_ptr<T>(ctx.outputs[1]);
  T* rstd = out_ptr<T>(ctx.outputs[2]);
  const double eps = ctx.args<NormArgs>().eps;
  if constexpr (std::is_same_v<T, float>) {
    if (dim <= kWarpRowMax) {
      const int d = static_cast<int>(dim);
      with_row_slots(dim, [&](auto slots) {
        ln_forward_warp_kernel<decltype(slots)::value>
            <<<warp_row_blocks(rows), kWarpRowThreads, 0, s>>>(xp, gamma, beta, rows, d, eps, y,
                                                               mean, rstd);
      });
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      return;
    }
  }
  ln_forward_kernel<T>
      <<<ln_row_blocks(rows), kThreads, 0, s>>>(xp, gamma, beta, rows, dim, eps, y, mean, rstd);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void layer_norm_backward_cuda(KernelContext& ctx) {
  layer_norm_backward_launch<T>(ctx);
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
  auto add = [&](const char* op, KernelFn fn) {
    r.get_mutable(op).kernels.push_back({DeviceType::cuda, kF32F64DTypes, std::move(fn)});
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
