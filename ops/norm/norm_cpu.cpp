#include "ops/norm/norm_cpu.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "device/communicator.h"
#include "device/device_context.h"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/norm/norm_args.h"

namespace qg::norm {
namespace {

// Batch norm runs on the thread pool in chunks of whole channels: every channel's sums and
// outputs are computed by one task exactly as a single thread computes them (channels share
// nothing), so the bytes are the same for every thread count.
template <typename Fn>
void for_each_channel(const ChannelLayout& l, const Fn& fn) {
  const int64_t per_channel = std::max<int64_t>(1, l.n * l.s);
  parallel_for(
      l.c, std::max<int64_t>(1, kElementGrain / per_channel),
      [&](int64_t begin, int64_t end) {
        for (int64_t ch = begin; ch < end; ++ch) fn(ch);
      },
      l.c * per_channel);
}

// Mean and 1/sqrt(var + eps) of `m` values from their f64 sum and sum of squares.
void moments(double sum, double sumsq, int64_t m, double eps, double* mean, double* var,
             double* invstd) {
  *mean = sum / static_cast<double>(m);
  *var = std::max(sumsq / static_cast<double>(m) - *mean * *mean, 0.0);
  *invstd = 1.0 / std::sqrt(*var + eps);
}

template <typename T>
void batch_norm_typed(KernelContext& ctx) {
  const ChannelLayout l = channel_layout(ctx.inputs[0].shape());
  const T* x = ctx.inputs[0].data<T>();
  const T* gamma = ctx.inputs[1].data<T>();
  const T* beta = ctx.inputs[2].data<T>();
  T* running_mean = ctx.inputs[3].data<T>();
  T* running_var = ctx.inputs[4].data<T>();
  T* y = ctx.outputs[0].data<T>();
  T* save_mean = ctx.outputs[1].data<T>();
  T* save_invstd = ctx.outputs[2].data<T>();
  const NormArgs& args = ctx.args<NormArgs>();
  const double eps = args.eps, momentum = args.momentum;
  const bool batch = uses_batch_statistics(ctx);
  const int64_t m = l.n * l.s;
  if (batch)
    QG_CHECK(m > 1, ctx.op, "expected more than 1 value per channel when training, got input ",
             ctx.inputs[0].str());
  // 1. Per-channel f64 sums of this rank's batch; 2. with SyncBatchNorm, summed over the
  //    ranks (with the count), so every rank normalises with the global batch's moments and
  //    moves the running statistics by them; 3. the moments and the output.
  Communicator* comm = batch ? ctx.device.batch_norm_sync() : nullptr;
  if (comm != nullptr && comm->world_size() == 1) comm = nullptr;
  std::vector<double> sums(batch ? static_cast<size_t>(2 * l.c) : 0);
  if (batch)
    for_each_channel(l, [&](int64_t ch) {
      double sum = 0, sumsq = 0;
      for (int64_t b = 0; b < l.n; ++b) {
        const T* p = x + (b * l.c + ch) * l.s;
        for (int64_t i = 0; i < l.s; ++i) {
          double v = static_cast<double>(p[i]);
          sum += v;
          sumsq += v * v;
        }
      }
      sums[2 * ch] = sum;
      sums[2 * ch + 1] = sumsq;
    });
  const int64_t count = comm ? m * comm->world_size() : m;
  if (comm) comm->all_reduce(sums.data(), 2 * l.c, DType::f64, ReduceOp::sum);
  for_each_channel(l, [&](int64_t ch) {
    double mean, var, invstd;
    if (batch) {
      const int64_t m = count;  // the global batch's values per channel
      moments(sums[2 * ch], sums[2 * ch + 1], m, eps, &mean, &var, &invstd);
      // torch: the running variance takes the unbiased batch variance.
      double unbiased = var * static_cast<double>(m) / static_cast<double>(m - 1);
      running_mean[ch] = static_cast<T>((1.0 - momentum) * running_mean[ch] + momentum * mean);
      running_var[ch] = static_cast<T>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    } else {
      mean = static_cast<double>(running_mean[ch]);
      invstd = 1.0 / std::sqrt(static_cast<double>(running_var[ch]) + eps);
    }
    save_mean[ch] = static_cast<T>(mean);
    save_invstd[ch] = static_cast<T>(invstd);
    const T mu = static_cast<T>(mean), is = static_cast<T>(invstd), g = gamma[ch], bt = beta[ch];
    for (int64_t b = 0; b < l.n; ++b) {
      const int64_t base = (b * l.c + ch) * l.s;
      for (int64_t i = 0; i < l.s; ++i) y[base + i] = (x[base + i] - mu) * is * g + bt;
    }
  });
  ctx.outputs[3].data<T>()[0] = batch ? T(1) : T(0);
}

template <typename T>
void batch_norm_backward_typed(KernelContext& ctx) {
  const ChannelLayout l = channel_layout(ctx.inputs[1].shape());
  const T* dy = ctx.inputs[0].data<T>();
  const T* x = ctx.inputs[1].data<T>();
  const T* gamma = ctx.inputs[2].data<T>();
  const T* save_mean = ctx.inputs[3].data<T>();
  const T* save_invstd = ctx.inputs[4].data<T>();
  const bool batch = ctx.inputs[5].data<T>()[0] != T(0);
  T* dx = ctx.outputs[0].data<T>();
  T* dgamma = ctx.outputs[1].data<T>();
  T* dbeta = ctx.outputs[2].data<T>();
  // SyncBatchNorm: the mean and variance were the global batch's, so the terms through them
  // take the global sums of dy and dy * xhat (all-reduced) over the global count. dgamma and
  // dbeta stay this rank's sums: the gradient sync averages them like every parameter's.
  Communicator* comm = batch ? ctx.device.batch_norm_sync() : nullptr;
  if (comm != nullptr && comm->world_size() == 1) comm = nullptr;
  const double m = static_cast<double>(l.n * l.s) * (comm ? comm->world_size() : 1);
  std::vector<double> sums(static_cast<size_t>(2 * l.c));
  for_each_channel(l, [&](int64_t ch) {
    const T mu = save_mean[ch], is = save_invstd[ch];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t b = 0; b < l.n; ++b) {
      const int64_t base = (b * l.c + ch) * l.s;
      for (int64_t i = 0; i < l.s; ++i) {
        double d = static_cast<double>(dy[base + i]);
        sum_dy += d;
        sum_dy_xhat += d * static_cast<double>((x[base + i] - mu) * is);
      }
    }
    dbeta[ch] = static_cast<T>(sum_dy);
    dgamma[ch] = static_cast<T>(sum_dy_xhat);
    sums[2 * ch] = sum_dy;
    sums[2 * ch + 1] = sum_dy_xhat;
  });
  if (comm) comm->all_reduce(sums.data(), 2 * l.c, DType::f64, ReduceOp::sum);
  for_each_channel(l, [&](int64_t ch) {
    const T is = save_invstd[ch];
    const T mu = save_mean[ch];
    const double sum_dy = sums[2 * ch], sum_dy_xhat = sums[2 * ch + 1];
    // Batch statistics: the gradient also flows through the mean and the variance.
    const T a = static_cast<T>(static_cast<double>(gamma[ch]) * static_cast<double>(is));
    const T mean_dy = batch ? static_cast<T>(sum_dy / m) : T(0);
    const T mean_dy_xhat = batch ? static_cast<T>(sum_dy_xhat / m) : T(0);
    for (int64_t b = 0; b < l.n; ++b) {
      const int64_t base = (b * l.c + ch) * l.s;
      for (int64_t i = 0; i < l.s; ++i) {
        T xhat = (x[base + i] - mu) * is;
        dx[base + i] = a * (dy[base + i] - mean_dy - xhat * mean_dy_xhat);
      }
    }
  });
}

// Rows per chunk of the layer-norm loops: about kElementGrain elements, at least one row.
int64_t layer_norm_row_grain(int64_t d) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(d, 1));
}

template <typename T>
void layer_norm_typed(KernelContext& ctx) {
  const Tensor& xt = ctx.inputs[0];
  const int64_t d = xt.shape().back(), rows = d == 0 ? 0 : xt.numel() / d;
  const T* x = xt.data<T>();
  const T* gamma = ctx.inputs[1].data<T>();
  const T* beta = ctx.inputs[2].data<T>();
  T* y = ctx.outputs[0].data<T>();
  T* mean_out = ctx.outputs[1].data<T>();
  T* rstd_out = ctx.outputs[2].data<T>();
  const double eps = ctx.args<NormArgs>().eps;
  // Rows are independent: chunks of whole rows give the same bytes for any thread count.
  parallel_for(
      rows, layer_norm_row_grain(d),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* p = x + r * d;
          double sum = 0, sumsq = 0;
          for (int64_t j = 0; j < d; ++j) {
            double v = static_cast<double>(p[j]);
            sum += v;
            sumsq += v * v;
          }
          double mean, var, rstd;
          moments(sum, sumsq, d, eps, &mean, &var, &rstd);
          mean_out[r] = static_cast<T>(mean);
          rstd_out[r] = static_cast<T>(rstd);
          const T mu = static_cast<T>(mean), rs = static_cast<T>(rstd);
          for (int64_t j = 0; j < d; ++j) y[r * d + j] = (p[j] - mu) * rs * gamma[j] + beta[j];
        }
      },
      rows * d);
}

template <typename T>
void layer_norm_backward_typed(KernelContext& ctx) {
  const Tensor& xt = ctx.inputs[1];
  const int64_t d = xt.shape().back(), rows = d == 0 ? 0 : xt.numel() / d;
  const T* dy = ctx.inputs[0].data<T>();
  const T* x = xt.data<T>();
  const T* gamma = ctx.inputs[2].data<T>();
  const T* mean = ctx.inputs[3].data<T>();
  const T* rstd = ctx.inputs[4].data<T>();
  T* dx = ctx.outputs[0].data<T>();
  // Chunks of whole rows: dx row by row, and per-chunk column sums for dgamma / dbeta, added
  // in chunk order, so the bytes do not depend on the thread count.
  const int64_t grain = layer_norm_row_grain(d);
  const int64_t chunks = num_chunks(rows, grain);
  std::vector<double> part(static_cast<size_t>(chunks * 2 * d), 0.0);
  parallel_for(
      rows, grain,
      [&](int64_t r0, int64_t r1) {
        double* dgamma = part.data() + (r0 / grain) * 2 * d;
        double* dbeta = dgamma + d;
        for (int64_t r = r0; r < r1; ++r) {
          const T mu = mean[r], rs = rstd[r];
          double sum_g = 0, sum_g_xhat = 0;
          for (int64_t j = 0; j < d; ++j) {
            const int64_t i = r * d + j;
            T xhat = (x[i] - mu) * rs;
            double g = static_cast<double>(dy[i] * gamma[j]);
            sum_g += g;
            sum_g_xhat += g * static_cast<double>(xhat);
            dgamma[j] += static_cast<double>(dy[i] * xhat);
            dbeta[j] += static_cast<double>(dy[i]);
          }
          const T mean_g = static_cast<T>(sum_g / d), mean_g_xhat = static_cast<T>(sum_g_xhat / d);
          for (int64_t j = 0; j < d; ++j) {
            const int64_t i = r * d + j;
            T xhat = (x[i] - mu) * rs;
            dx[i] = rs * (dy[i] * gamma[j] - mean_g - xhat * mean_g_xhat);
          }
        }
      },
      rows * d);
  T* dg = ctx.outputs[1].data<T>();
  T* db = ctx.outputs[2].data<T>();
  for (int64_t j = 0; j < d; ++j) {
    double g = 0, b = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      g += part[static_cast<size_t>(c * 2 * d + j)];
      b += part[static_cast<size_t>(c * 2 * d + d + j)];
    }
    dg[j] = static_cast<T>(g);
    db[j] = static_cast<T>(b);
  }
}

}  // namespace

ChannelLayout channel_layout(const Shape& x) {
  ChannelLayout l;
  l.n = x[0];
  l.c = x[1];
  l.s = 1;
  for (size_t i = 2; i < x.size(); ++i) l.s *= x[i];
  return l;
}

bool uses_batch_statistics(const KernelContext& ctx) {
  return ctx.training && ctx.states[0].data<float>()[0] == 0.0f;
}

void batch_norm_cpu(KernelContext& ctx) {
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { batch_norm_typed<decltype(tag)>(ctx); });
}
void batch_norm_backward_cpu(KernelContext& ctx) {
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { batch_norm_backward_typed<decltype(tag)>(ctx); });
}
void layer_norm_cpu(KernelContext& ctx) {
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { layer_norm_typed<decltype(tag)>(ctx); });
}
void layer_norm_backward_cpu(KernelContext& ctx) {
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { layer_norm_backward_typed<decltype(tag)>(ctx); });
}

}  // namespace qg::norm
