// CUDA kernel of rope: one block per step t (every batch row) when the position ids
// broadcast over the batch, else one block per (batch, step) pair. Its threads first compute
// the cos and sin of every frequency for that position into shared memory (once, not once
// per head or per batch row), then apply them to the step's row in every head (and batch
// row), pairs (j, j + half) per thread, consecutive threads on consecutive j. (A block per
// (batch, step) pair with broadcast positions computed each f64 table `batch` times. Sharing
// the tables did not speed up the Llama step's rope, which stays at about 5x its bandwidth
// floor for a reason not yet measured.) The arithmetic is rope_math.h's, the same
// as the CPU kernel's; cos and sin come from CUDA's f64 functions rather than the host
// libm, so outputs are compared to rounding (rope_crosscheck.cpp).
#include <algorithm>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/rope/rope_args.h"
#include "ops/rope/rope_math.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(const T* __restrict__ x, const int64_t* __restrict__ pos, T* __restrict__ y,
                RopeLayout l) {
  using M = math_of<T>;
  __shared__ M cs[kRopeMaxHalf];
  __shared__ M sn[kRopeMaxHalf];
  const int64_t half = l.dim / 2;
  // A unit is a step t of rows b0 .. b0 + rows - 1.
  const int64_t rows = l.positions_broadcast ? l.batch : 1;
  const int64_t units = l.positions_broadcast ? l.seq : l.batch * l.seq;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t b0 = l.positions_broadcast ? 0 : unit / l.seq, t = unit % l.seq;
    const int64_t position = pos[b0 * l.seq + t];
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const float a = rope_math::angle_of(position, l.inv_freq[i]);
      const M s = to_math(from_math<T>(static_cast<M>(rope_math::sin_f32(a))));
      cs[i] = to_math(from_math<T>(static_cast<M>(rope_math::cos_f32(a))));
      sn[i] = l.inverse ? -s : s;
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < rows * l.heads * half; k += blockDim.x) {
      const int64_t row = k / half, j = k % half;  // row: (b - b0) * heads + h
      const int64_t o = ((b0 * l.heads + row) * l.seq + t) * l.dim;
      const M x1 = to_math(x[o + j]), x2 = to_math(x[o + j + half]);
      const M c = cs[j], s = sn[j];
      const M a1 = to_math(from_math<T>(x1 * c)), b1 = to_math(from_math<T>(-x2 * s));
      const M a2 = to_math(from_math<T>(x2 * c)), b2 = to_math(from_math<T>(x1 * s));
      y[o + j] = from_math<T>(a1 + b1);
      y[o + j + half] = from_math<T>(a2 + b2);
    }
    __syncthreads();  // the next step rewrites the tables
  }
}

void rope_cuda(KernelContext& ctx) {
  const RopeLayout& l = ctx.args<RopeArgs>().layout;
  if (ctx.inputs[0].numel() == 0) return;
  cudaStream_t stream = cuda_stream(ctx.device);
  const int64_t units = l.positions_broadcast ? l.seq : l.batch * l.seq;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(units, int64_t{1} << 20));
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<blocks, kThreads, 0, stream>>>(
        in_ptr<T>(ctx.inputs[0]), in_ptr<int64_t>(ctx.inputs[1]), out_ptr<T>(ctx.outputs[0]), l);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_rope_cuda_kernels(OpRegistry& r) {
  r.get_mutable("rope").kernels.push_back({DeviceType::cuda, kFloatDTypes, rope_cuda});
}

}  // namespace qg
