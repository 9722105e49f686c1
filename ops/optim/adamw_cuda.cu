// The CUDA adamw kernel: the CPU kernel's per-element expressions (adamw_math.cuh, shared with
// the multi-tensor kernel), with the rate and grad_scale read from their device scalars. A
// one-thread kernel first checks them and advances the step counter; the update then reads
// the counter. A bad rate or a non-finite grad_scale leaves everything
// unchanged and is recorded as a device error: no host synchronisation, and the same launches
// whatever the values, so the step replays as one CUDA graph.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/optim/adamw_math.cuh"
#include "ops/optim/optim_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

__global__ void adamw_advance_step(int64_t* step, const double* lr, const float* scale,
                                   DeviceErrorRecord* err, int32_t node) {
  const double rate = *lr;
  const float s = *scale;
  if (!isfinite(s))
    report_device_error(err, kNonFiniteGradNorm, node, 0, static_cast<double>(s));
  else if (!isfinite(rate) || rate < 0.0)
    report_device_error(err, kBadLearningRate, node, 0, rate);
  else
    ++*step;
}

template <typename T>
__global__ void adamw_kernel(T* p, const T* grad, T* m, T* v, const int64_t* step, const double* lr,
                             const float* scale, int64_t n, double beta1, double beta2, double eps,
                             double weight_decay, bool decoupled) {
  const double rate = *lr;
  const float s = *scale;
  if (!optim_cuda::adamw_usable(rate, s)) return;
  const optim_cuda::AdamWScalars<T> a =
      optim_cuda::adamw_scalars<T>(rate, s, *step, beta1, beta2, eps, weight_decay, decoupled);
  for (int64_t i = global_thread(); i < n; i += global_stride())
    optim_cuda::adamw_element(a, p[i], grad[i], m[i], v[i]);
}

template <typename T>
void adamw_cuda(KernelContext& ctx) {
  const AdamWArgs& a = ctx.args<AdamWArgs>();
  auto stream = cuda_stream(ctx.device);
  const int64_t n = ctx.inputs[0].numel();
  int64_t* step = ctx.states[2].data<int64_t>();
  const double* lr = ctx.inputs[2].data<double>();
  const float* scale = ctx.inputs[3].data<float>();
  adamw_advance_step<<<1, 1, 0, stream>>>(step, lr, scale, error_record(ctx.device), ctx.site);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  int64_t blocks = (n + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks);
  adamw_kernel<T><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      ctx.inputs[0].data<T>(), ctx.inputs[1].data<T>(), ctx.states[0].data<T>(),
      ctx.states[1].data<T>(), step, lr, scale, n, a.beta1, a.beta2, a.eps, a.weight_decay,
      a.decoupled);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_adamw_cuda_kernel(OpRegistry& r) {
  r.get_mutable("adamw").kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& c) {
                                              if (c.inputs[0].dtype() == DType::f64)
                                                adamw_cuda<double>(c);
                                              else
                                                adamw_cuda<float>(c);
                                            }});
}

}  // namespace qg
