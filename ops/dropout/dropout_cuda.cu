// CUDA kernels of dropout and dropout_backward: the element expressions of the CPU kernels
// and the same generator (ops/common/philox.h), so masks and outputs match bit for bit. The
// step counter stays on the device: the kernel reads it and a one-thread kernel advances
// it afterwards on the same stream (no host synchronisation).
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/philox.h"
#include "ops/dropout/dropout_reference.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T>
__global__ void dropout_kernel(const T* x, T* y, uint8_t* mask, const int64_t* step, int64_t n,
                               uint64_t seed, uint64_t threshold, math_of<T> scale) {
  using M = math_of<T>;
  const uint64_t s = static_cast<uint64_t>(*step);
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    const uint8_t keep = philox::keep_bit(seed, s, static_cast<uint64_t>(i), threshold);
    mask[i] = keep;
    y[i] = from_math<T>(to_math(x[i]) * static_cast<M>(keep) * scale);
  }
}

template <typename T>
__global__ void dropout_backward_kernel(const T* dy, const uint8_t* mask, T* dx, int64_t n,
                                        math_of<T> scale) {
  using M = math_of<T>;
  for (int64_t i = global_thread(); i < n; i += global_stride())
    dx[i] = from_math<T>(to_math(dy[i]) * static_cast<M>(mask[i]) * scale);
}

__global__ void advance_step(int64_t* step) {
  ++*step;
}

void dropout_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t n = x.numel();
  auto stream = cuda_stream(ctx.device);
  if (!ctx.training) {
    if (n == 0) return;
    QG_CUDA_CHECK(ctx.op, cudaMemcpyAsync(ctx.outputs[0].raw_data(), x.raw_data(), x.nbytes(),
                                          cudaMemcpyDeviceToDevice, stream));
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(ctx.outputs[1].raw_data(), 1, n, stream));
    return;
  }
  const DropoutArgs& args = ctx.args<DropoutArgs>();
  const double p = args.p;
  int64_t* step = ctx.states[0].data<int64_t>();
  if (n > 0) {
    dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      auto shape = elementwise_launch(n);
      dropout_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(
          in_ptr<T>(x), out_ptr<T>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]), step, n,
          args.seed, philox::drop_threshold(p), static_cast<math_of<T>>(1.0 / (1.0 - p)));
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  }
  advance_step<<<1, 1, 0, stream>>>(step);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void dropout_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const int64_t n = dy.numel();
  if (n == 0) return;
  const double keep_scale = dropout_backward_scale(ctx);
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    auto shape = elementwise_launch(n);
    dropout_backward_kernel<T><<<shape.blocks, shape.threads, 0, cuda_stream(ctx.device)>>>(
        in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), out_ptr<T>(ctx.outputs[0]), n,
        static_cast<math_of<T>>(keep_scale));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_dropout_cuda_kernels(OpRegistry& r) {
  r.get_mutable("dropout").kernels.push_back({DeviceType::cuda, kFloatDTypes, dropout_cuda});
  r.get_mutable("dropout_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, dropout_backward_cuda});
}

}  // namespace qg
