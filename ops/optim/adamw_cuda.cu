// The CUDA adamw kernel: the CPU kernel's per-element expressions (adamw_op.cpp; built with
// --fmad=false, so no contraction differs), with the rate and grad_scale read from their
// device scalars. A one-thread kernel first checks them and advances the step counter; the
// update then reads the counter. A bad rate or a non-finite grad_scale leaves everything
// unchanged and is recorded as a device error: no host synchronisation, and the same launches
// whatever the values, so the step replays as one CUDA graph.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/optim/optim_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

__device__ __forceinline__ bool usable(double lr, float scale) {
  return isfinite(lr) && lr >= 0.0 && isfinite(scale);
}

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
                             const float* scale, int64_t n, double beta1, double beta2, T b1, T b2,
                             T omb1, T omb2, T eps, double weight_decay, bool decoupled) {
  const double rate = *lr;
  const float s = *scale;
  if (!usable(rate, s)) return;
  const double t = static_cast<double>(*step);
  const T step_size = static_cast<T>(rate / (1.0 - pow(beta1, t)));
  const T bc2_sqrt = static_cast<T>(sqrt(1.0 - pow(beta2, t)));
  const T decay = static_cast<T>(1.0 - rate * weight_decay);
  const T wd = static_cast<T>(weight_decay);
  const bool decay_param = decoupled && weight_decay != 0.0;
  const bool decay_grad = !decoupled && weight_decay != 0.0;
  const T g_scale = static_cast<T>(s);
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    T g = grad[i] * g_scale;
    T pi = p[i];
    if (decay_grad) g = g + wd * pi;
    if (decay_param) pi = pi * decay;
    const T mi = b1 * m[i] + omb1 * g;
    const T vi = b2 * v[i] + omb2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const T denom = sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
  }
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
      ctx.states[1].data<T>(), step, lr, scale, n, a.beta1, a.beta2, static_cast<T>(a.beta1),
      static_cast<T>(a.beta2), static_cast<T>(1.0 - a.beta1), static_cast<T>(1.0 - a.beta2),
      static_cast<T>(a.eps), a.weight_decay, a.decoupled);
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
