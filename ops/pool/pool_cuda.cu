// CUDA kernels of the pooling ops. Forward: one thread per output cell, visiting its window
// in the CPU kernel's order (ops/pool/pool_geometry.h). Backward: one thread per input cell,
// gathering the windows that hold it in ascending output order, the order in which the CPU
// kernel's scatter adds, so sums of overlapping windows round identically (no atomics).
#include <cmath>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/pool/pool_attrs.h"

namespace qg {
namespace {

using namespace cuda;
using pool::PoolGeom;
using pool::Window;

template <typename T>
__global__ void max_pool_kernel(const T* x, T* y, int64_t* indices, PoolGeom g, int64_t n) {
  using M = math_of<T>;
  for (int64_t o = global_thread(); o < n; o += global_stride()) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    const T* plane = x + p * g.H * g.W;
    const Window w = pool::max_window(g, oh, ow);
    M best = static_cast<M>(-INFINITY);
    int64_t arg = w.h0 * g.W + w.w0;
    for (int64_t h = w.h0; h < w.h1; h += g.dH)
      for (int64_t c = w.w0; c < w.w1; c += g.dW) {
        const M v = to_math(plane[h * g.W + c]);
        if (v > best || v != v) {
          best = v;
          arg = h * g.W + c;
        }
      }
    y[o] = from_math<T>(best);
    indices[o] = arg;
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(const T* dy, const int64_t* indices, T* dx, PoolGeom g,
                                         int64_t n) {
  using M = math_of<T>;
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    const int64_t c = i % g.W, h = (i / g.W) % g.H, p = i / (g.W * g.H);
    const int64_t cell = h * g.W + c, base = p * g.OH * g.OW;
    int64_t oh0, oh1, ow0, ow1;
    pool::covering_outputs(h, g.kH, g.sH, g.pH, g.dH, g.OH, oh0, oh1);
    pool::covering_outputs(c, g.kW, g.sW, g.pW, g.dW, g.OW, ow0, ow1);
    M acc = M(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = base + oh * g.OW + ow;
        if (indices[o] == cell && !pool::is_empty(pool::max_window(g, oh, ow)))
          acc += to_math(dy[o]);
      }
    dx[i] = from_math<T>(acc);
  }
}

template <typename T>
__global__ void avg_pool_kernel(const T* x, T* y, PoolGeom g, int64_t n) {
  using M = math_of<T>;
  for (int64_t o = global_thread(); o < n; o += global_stride()) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, p = o / (g.OW * g.OH);
    const T* plane = x + p * g.H * g.W;
    int64_t divisor = 0;
    const Window w = pool::avg_window(g, oh, ow, divisor);
    M sum = M(0);
    for (int64_t h = w.h0; h < w.h1; ++h)
      for (int64_t c = w.w0; c < w.w1; ++c) sum += to_math(plane[h * g.W + c]);
    y[o] = from_math<T>(divisor == 0 ? M(0) : sum / static_cast<M>(divisor));
  }
}

template <typename T>
__global__ void avg_pool_backward_kernel(const T* dy, T* dx, PoolGeom g, int64_t n) {
  using M = math_of<T>;
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    const int64_t c = i % g.W, h = (i / g.W) % g.H, p = i / (g.W * g.H);
    int64_t oh0, oh1, ow0, ow1;
    pool::covering_outputs(h, g.kH, g.sH, g.pH, 1, g.OH, oh0, oh1);
    pool::covering_outputs(c, g.kW, g.sW, g.pW, 1, g.OW, ow0, ow1);
    M acc = M(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        int64_t divisor = 0;
        const Window w = pool::avg_window(g, oh, ow, divisor);
        if (divisor == 0 || h < w.h0 || h >= w.h1 || c < w.w0 || c >= w.w1) continue;
        acc += to_math(dy[(p * g.OH + oh) * g.OW + ow]) / static_cast<M>(divisor);
      }
    dx[i] = from_math<T>(acc);
  }
}

// One warp per plane (the summation order of pool::kPlaneSumLanes): lane j sums elements
// j, j + 32, ... in order, then the lanes fold with shuffles, j + off into j.
template <typename T>
__global__ void global_avg_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes,
                                  int64_t hw) {
  static_assert(pool::kPlaneSumLanes == 32, "one warp per plane");
  using M = math_of<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t p = global_thread() / 32; p < planes; p += warps) {
    const T* plane = x + p * hw;
    M sum = M(0);
#pragma unroll 4
    for (int64_t i = lane; i < hw; i += 32) sum += to_math(plane[i]);
    for (int off = 16; off > 0; off /= 2) sum = sum + __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) y[p] = from_math<T>(sum / static_cast<M>(hw));
  }
}

template <typename T>
__global__ void global_avg_backward_kernel(const T* dy, T* dx, int64_t hw, int64_t n) {
  using M = math_of<T>;
  for (int64_t i = global_thread(); i < n; i += global_stride())
    dx[i] = from_math<T>(to_math(dy[i / hw]) / static_cast<M>(hw));
}

// Launches kernel(args...) over n threads (grid-stride) on the op's stream, then checks the
// launch.
template <typename K, typename... Args>
void launch(KernelContext& ctx, int64_t n, K kernel, Args... args) {
  if (n == 0) return;
  auto shape = elementwise_launch(n);
  kernel<<<shape.blocks, shape.threads, 0, cuda_stream(ctx.device)>>>(args...);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void max_pool_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, ctx.outputs[0].numel(), max_pool_kernel<T>, in_ptr<T>(x),
           out_ptr<T>(ctx.outputs[0]), out_ptr<int64_t>(ctx.outputs[1]), g, ctx.outputs[0].numel());
  });
}

void max_pool_backward_cuda(KernelContext& ctx) {
  const PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, ctx.outputs[0].numel(), max_pool_backward_kernel<T>, in_ptr<T>(ctx.inputs[0]),
           in_ptr<int64_t>(ctx.inputs[1]), out_ptr<T>(ctx.outputs[0]), g, ctx.outputs[0].numel());
  });
}

void avg_pool_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, ctx.outputs[0].numel(), avg_pool_kernel<T>, in_ptr<T>(x),
           out_ptr<T>(ctx.outputs[0]), g, ctx.outputs[0].numel());
  });
}

void avg_pool_backward_cuda(KernelContext& ctx) {
  const PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, ctx.outputs[0].numel(), avg_pool_backward_kernel<T>, in_ptr<T>(ctx.inputs[0]),
           out_ptr<T>(ctx.outputs[0]), g, ctx.outputs[0].numel());
  });
}

void global_avg_cuda(KernelContext& ctx) {
  const Shape& s = ctx.inputs[0].shape();
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, s[0] * s[1] * 32, global_avg_kernel<T>, in_ptr<T>(ctx.inputs[0]),
           out_ptr<T>(ctx.outputs[0]), s[0] * s[1], s[2] * s[3]);
  });
}

void global_avg_backward_cuda(KernelContext& ctx) {
  const Shape& s = ctx.outputs[0].shape();
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch(ctx, ctx.outputs[0].numel(), global_avg_backward_kernel<T>, in_ptr<T>(ctx.inputs[0]),
           out_ptr<T>(ctx.outputs[0]), s[2] * s[3], ctx.outputs[0].numel());
  });
}

}  // namespace

void add_pool_cuda_kernels(OpRegistry& r) {
  const std::pair<const char*, KernelFn> kernels[] = {
      {"max_pool2d", max_pool_cuda},
      {"max_pool2d_backward", max_pool_backward_cuda},
      {"avg_pool2d", avg_pool_cuda},
      {"avg_pool2d_backward", avg_pool_backward_cuda},
      {"global_avg_pool2d", global_avg_cuda},
      {"global_avg_pool2d_backward", global_avg_backward_cuda},
  };
  for (const auto& [name, fn] : kernels)
    r.get_mutable(name).kernels.push_back({DeviceType::cuda, kFloatDTypes, fn});
}

}  // namespace qg
