// CUDA kernels of fused_channel_div_batch_norm and its backward (ops/fused/
// channel_div_bn/channel_div_bn_op.cpp): a folded conv-bn block's channel_div and batch_norm
// without the quotient q = x / s[c] in memory. Each kernel that would read q reads x and divides
// where it loads it. The division is ExactDivisor's (ops/common/exact_divisor.h): the bits of the
// IEEE division channel_div_kernel rounds q with, in four fused multiply-adds per element
// after a per-thread set-up (nvcc divides correctly rounded: no fast math), so every kernel
// sees q's exact bits.
//   forward:  stats of q (stretch_sums) -> bn_finalize_kernel -> y = bn_normalize(q)
//   backward: grad stats of (dy, q) -> bn_grad_finalize_kernel -> one stretch_sums pass that
//             forms batch_norm's dx (bn_input_grad, rounded in T), dx / s and the ds partials
//             -> channel_div_fold_kernel.
// Every kernel that reads x runs a block per (stretch, channel), so a thread sets up its
// channel's divisor once. The reductions have the unfused kernels' launch shapes (ChannelDims)
// and per-element expressions (channel_cuda.cuh), so each f64 partial sum adds the same terms
// in the same order: the fused results equal the unfused CUDA graph bit for bit, outputs,
// running statistics and gradients alike. The backward's last pass has
// channel_div_grad_kernel's stretch_sums shape (not the per-plane walk of bn_dx_kernel): the
// elementwise dx values do not depend on the walk, the ds partials do.
#include "core/graph.h"
#include "device/communicator.h"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/common/exact_divisor.h"
#include "ops/norm/channel_cuda.cuh"
#include "ops/norm/norm_args.h"

namespace qg {
namespace {

using namespace cuda;
using namespace norm_cuda;

template <typename T>
__global__ void cdbn_stats_kernel(const T* __restrict__ x, const T* __restrict__ s,
                                  const float* frozen, ChannelDims d, double2* partial) {
  if (*frozen != 0.0f) return;  // running statistics: nothing to reduce
  const ExactDivisor<T> unscale(s[blockIdx.y]);
  stretch_sums(
      d, partial, [&](int64_t i) { return x[i]; },
      [&](int64_t, int64_t, T xv) {
        const double v = static_cast<double>(unscale(xv));
        return make_double2(v, v * v);
      });
}

template <typename T>
__global__ void cdbn_apply_kernel(const T* __restrict__ x, const T* __restrict__ s,
                                  const T* __restrict__ gamma, const T* __restrict__ beta,
                                  const T* __restrict__ mean, const T* __restrict__ invstd,
                                  ChannelDims d, T* __restrict__ y) {
  const int64_t ch = blockIdx.y;
  const ExactDivisor<T> unscale(s[ch]);
  const T m = mean[ch], is = invstd[ch], g = gamma[ch], b = beta[ch];
  stretch_each(
      d, [&](int64_t i) { return x[i]; },
      [&](int64_t i, T xv) { y[i] = bn_normalize(unscale(xv), m, is, g, b); });
}

template <typename T>
__global__ void cdbn_grad_stats_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                       const T* __restrict__ s, const T* __restrict__ mean,
                                       const T* __restrict__ invstd, ChannelDims d,
                                       double2* partial) {
  const T m = mean[blockIdx.y], is = invstd[blockIdx.y];
  const ExactDivisor<T> unscale(s[blockIdx.y]);
  stretch_sums(
      d, partial, [&](int64_t i) { return make_pair2(dy[i], x[i]); },
      [&](int64_t, int64_t, Pair2<T> v) {
        const double g = static_cast<double>(v.a);
        return make_double2(g, g * static_cast<double>((unscale(v.b) - m) * is));
      });
}

// batch_norm's dx, then channel_div_backward's dx = that / s and the partials of
// sum(dx * q), exactly as channel_div_grad_kernel forms them from the stored dx and q.
template <typename T>
__global__ void cdbn_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                               const T* __restrict__ s, const T* __restrict__ mean,
                               const T* __restrict__ invstd, const T* __restrict__ coef,
                               ChannelDims d, T* __restrict__ dx, double2* partial) {
  const int64_t ch = blockIdx.y;
  const T m = mean[ch], is = invstd[ch];
  const ExactDivisor<T> unscale(s[ch]);
  const T* c = coef + 3 * ch;
  stretch_sums(
      d, partial, [&](int64_t i) { return make_pair2(dy[i], x[i]); },
      [&](int64_t, int64_t i, Pair2<T> v) {
        const T q = unscale(v.b);
        const T g = unscale(bn_input_grad(v.a, q, m, is, c));
        dx[i] = g;
        const T product = g * q;
        return make_double2(static_cast<double>(product), 0.0);
      });
}

// The fused kernels have no point between a rank's sums and their use where the ranks could
// combine theirs: compile() leaves this fusion out when SyncBatchNorm is on, and a graph fused
// by other means is refused rather than run with one rank's statistics.
void refuse_batch_norm_sync(const KernelContext& ctx) {
  const Communicator* comm = ctx.device.batch_norm_sync();
  QG_CHECK(comm == nullptr || comm->world_size() < 2, ctx.op, "SyncBatchNorm over ",
           comm ? comm->world_size() : 0,
           " ranks needs channel_div and batch_norm unfused (disable fuse_channel_div_batch_norm)");
}

template <typename T>
void forward_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const NormArgs& bn = ctx.part(1).args<NormArgs>();
  ChannelDims d = channel_dims(x.shape());
  auto st = cuda_stream(ctx.device);
  QG_CHECK(d.c <= 65535, ctx.op, "at most 65535 channels (one grid row each), got ", x.str());
  if (ctx.training) refuse_batch_norm_sync(ctx);
  if (ctx.training)
    QG_CHECK(d.m > 1, ctx.op, "expected more than 1 value per channel when training, got input ",
             x.str());
  QG_CHECK(ctx.inputs[4].is_contiguous() && ctx.inputs[5].is_contiguous(), ctx.op,
           "running_mean and running_var must be contiguous (they are updated in place)");
  const T* s = in_ptr<T>(ctx.inputs[1]);
  const float* frozen = in_ptr<float>(ctx.states[0]);
  Tensor partial;
  if (ctx.training && d.c > 0 && d.m > 0) {
    partial = Tensor::empty({d.c * d.splits * 2}, DType::f64, x.device());
    cdbn_stats_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, st>>>(
        in_ptr<T>(x), s, frozen, d, out_ptr<double2>(partial));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
  auto fin = elementwise_launch(std::max<int64_t>(d.c, 1));
  bn_finalize_kernel<T><<<fin.blocks, fin.threads, 0, st>>>(
      partial.defined() ? in_ptr<double2>(partial) : nullptr, frozen, ctx.training, d, bn.eps,
      bn.momentum, out_ptr<T>(ctx.inputs[4]), out_ptr<T>(ctx.inputs[5]), out_ptr<T>(ctx.outputs[1]),
      out_ptr<T>(ctx.outputs[2]), out_ptr<T>(ctx.outputs[3]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  if (d.c == 0 || d.m == 0) return;
  cdbn_apply_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, st>>>(
      in_ptr<T>(x), s, in_ptr<T>(ctx.inputs[2]), in_ptr<T>(ctx.inputs[3]),
      in_ptr<T>(ctx.outputs[1]), in_ptr<T>(ctx.outputs[2]), d, out_ptr<T>(ctx.outputs[0]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& x = ctx.inputs[1];
  ChannelDims d = channel_dims(x.shape());
  auto st = cuda_stream(ctx.device);
  refuse_batch_norm_sync(ctx);
  if (d.c == 0) return;
  QG_CHECK(d.c <= 65535, ctx.op, "at most 65535 channels (one grid row each), got ", x.str());
  const T* s = in_ptr<T>(ctx.inputs[2]);
  const T* mean = in_ptr<T>(ctx.inputs[4]);
  const T* invstd = in_ptr<T>(ctx.inputs[5]);
  Tensor partial = Tensor::empty({d.c * d.splits * 2}, DType::f64, x.device());
  Tensor coef = Tensor::empty({d.c * 3}, x.dtype(), x.device());
  if (d.m > 0) {
    cdbn_grad_stats_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, st>>>(
        in_ptr<T>(dy), in_ptr<T>(x), s, mean, invstd, d, out_ptr<double2>(partial));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  } else {
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(partial.raw_data(), 0, partial.nbytes(), st));
  }
  auto fin = elementwise_launch(d.c);
  bn_grad_finalize_kernel<T><<<fin.blocks, fin.threads, 0, st>>>(
      in_ptr<double2>(partial), in_ptr<T>(ctx.inputs[3]), invstd, in_ptr<T>(ctx.inputs[6]), d,
      out_ptr<T>(ctx.outputs[2]), out_ptr<T>(ctx.outputs[3]), out_ptr<T>(coef));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  if (d.m == 0) {  // no elements: ds is an empty sum, as channel_div_backward writes it
    QG_CUDA_CHECK(ctx.op,
                  cudaMemsetAsync(ctx.outputs[1].raw_data(), 0, ctx.outputs[1].nbytes(), st));
    return;
  }
  // The grad-stats partials are consumed (bn_grad_finalize_kernel ran before on this
  // stream), so the ds partials reuse the buffer: the same [C, splits] double2 layout.
  cdbn_dx_kernel<T><<<dim3(d.splits, static_cast<unsigned>(d.c)), kThreads, 0, st>>>(
      in_ptr<T>(dy), in_ptr<T>(x), s, mean, invstd, in_ptr<T>(coef), d, out_ptr<T>(ctx.outputs[0]),
      out_ptr<double2>(partial));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  channel_div_fold_kernel<T>
      <<<fin.blocks, fin.threads, 0, st>>>(in_ptr<double2>(partial), d, out_ptr<T>(ctx.outputs[1]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_channel_div_bn_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_channel_div_batch_norm")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                                             [&](auto tag) { forward_cuda<decltype(tag)>(ctx); });
                          }});
  r.get_mutable("fused_channel_div_batch_norm_backward")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                                             [&](auto tag) { backward_cuda<decltype(tag)>(ctx); });
                          }});
}

}  // namespace qg
