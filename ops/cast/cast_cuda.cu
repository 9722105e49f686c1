// CUDA kernel of cast: the CPU's steps (ops/cast/cast_element.h) with the device types:
// widen exactly to the source's math type, convert to the destination's, narrow once with
// from_math (round to nearest even, NaN as the CPU writes it). Bit-identical to the CPU.
#include <type_traits>

#include "core/graph.h"
#include "core/strided_layout.h"
#include "ops/common/cuda_common.cuh"

namespace qg {
namespace {

using namespace cuda;

template <typename Dst, typename Src>
__device__ __forceinline__ Dst cast_element(Src v) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return v;
  } else {
    return from_math<Dst>(static_cast<math_of<Dst>>(to_math(v)));
  }
}

template <typename Dst, typename Src>
__global__ void cast_kernel(const Src* __restrict__ in, Dst* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = cast_element<Dst>(in[i]);
}

// The same from a strided view of x (a transpose or slice): writes y contiguous.
template <typename Dst, typename Src>
__global__ void cast_strided_kernel(const Src* __restrict__ in, Dst* __restrict__ out, int64_t n,
                                    StridedLayout from) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = cast_element<Dst>(in[from.offset(i)]);
}

void cast_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  cudaStream_t stream = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto src) {
    using Src = decltype(src);
    dispatch_float(y.dtype(), ctx.op, [&](auto dst) {
      using Dst = decltype(dst);
      auto shape = elementwise_launch(y.numel());
      const StridedLayout from = strided_layout(ctx.op, x);
      if (from.contiguous)
        cast_kernel<Dst, Src><<<shape.blocks, shape.threads, 0, stream>>>(
            in_ptr<Src>(x), out_ptr<Dst>(y), y.numel());
      else
        cast_strided_kernel<Dst, Src><<<shape.blocks, shape.threads, 0, stream>>>(
            in_ptr<Src>(x), out_ptr<Dst>(y), y.numel(), from);
      QG_CUDA_CHECK_LAUNCH("cast");
    });
  });
}

}  // namespace

void add_cast_cuda_kernels(OpRegistry& r) {
  r.get_mutable("cast").kernels.push_back({DeviceType::cuda, kFloatDTypes, cast_cuda,
                                           /*strided=*/true});
}

}  // namespace qg
