// CUDA kernel of cast: the CPU's steps (ops/cast/cast_element.h) with the device types:
// widen exactly to the source's math type, convert to the destination's, narrow once with
// from_math (round to nearest even, NaN as the CPU writes it). Bit-identical to the CPU.
// A contiguous x goes in packs of 8 elements (whole 16-byte loads and stores, several packs a
// thread in flight: ops/common/cuda_vec.cuh). The one-element loop before it kept 2 bytes a
// thread in flight for bf16: the 207M Llama step's casts took 2.25x the time their bytes take
// at the H200's memory peak (8da4w step, `qat steps --floors`), 2.1x on an H100 (float step).
#include <type_traits>

#include "core/graph.h"
#include "core/strided_layout.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"

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

// Contiguous x in packs of 8: pack b is elements 8b .. 8b + 7; the last partial pack (fewer
// than 8 elements) is one thread's.
template <typename Dst, typename Src, typename I>
__global__ void __launch_bounds__(kPackThreads)
    cast_packs_kernel(const Src* __restrict__ in, Dst* __restrict__ out, int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  flat_packs<kPacksPerThread<Src>>(
      nfull, [&](I b) { return load_pack(in, b, vec); },
      [&](I b, const Pack8<Src>& v) {
        Pack8<Dst> r;
#pragma unroll
        for (int j = 0; j < 8; ++j) r.v[j] = cast_element<Dst>(v.v[j]);
        store_pack(out, b, vec, r);
      });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) out[k] = cast_element<Dst>(in[k]);
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
      const int64_t n = y.numel();
      const StridedLayout from = strided_layout(ctx.op, x);
      if (from.contiguous) {
        const bool vec = aligned16(x.raw_data()) && aligned16(y.raw_data());
        dispatch_index(n, [&](auto itag) {
          cast_packs_kernel<Dst, Src, decltype(itag)>
              <<<pack_blocks<kPacksPerThread<Src>>(n / 8), kPackThreads, 0, stream>>>(
                  in_ptr<Src>(x), out_ptr<Dst>(y), n, vec);
        });
      } else {
        auto shape = elementwise_launch(n);
        cast_strided_kernel<Dst, Src>
            <<<shape.blocks, shape.threads, 0, stream>>>(in_ptr<Src>(x), out_ptr<Dst>(y), n, from);
      }
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
