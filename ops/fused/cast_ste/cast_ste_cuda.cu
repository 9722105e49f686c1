// CUDA kernel of fused_cast_ste: dx = f32(dy) where the mask bit is set, else +0, in packs of
// 8 elements (one mask byte, a 16-byte load of dy, two 16-byte stores of dx). Widening with
// to_math is the cast kernel's conversion (exact, NaN payloads kept), and a clear bit writes
// +0 as ste_backward does: the unfused cast + ste_backward's result bit for bit.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/fused/cast_ste/cast_ste.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    cast_ste_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask,
                    float* __restrict__ dx, int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  struct In {
    Pack8<T> v;
    unsigned bits;
  };
  flat_packs<kPacksPerThread<T>>(
      nfull,
      [&](I b) {
        return In{load_pack(dy, b, vec), mask[b]};
      },
      [&](I b, const In& in) {
        Pack8<float> r;
#pragma unroll
        for (int j = 0; j < 8; ++j) r.v[j] = (in.bits >> j) & 1u ? to_math(in.v.v[j]) : 0.0f;
        store_pack(dx, b, vec, r);
      });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k)
      dx[k] = (mask[nfull] >> (k - nfull * 8)) & 1u ? to_math(dy[k]) : 0.0f;
}

void fused_cast_ste_cuda(KernelContext& ctx) {
  check_fused_cast_ste_inputs(ctx);
  const Tensor& dy = ctx.inputs[0];
  Tensor& dx = ctx.outputs[0];
  const int64_t n = dx.numel();
  if (n == 0) return;
  const bool vec = aligned16(dy.raw_data()) && aligned16(dx.raw_data());
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      cast_ste_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), out_ptr<float>(dx), n, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  };
  if (dy.dtype() == DType::bf16)
    launch(__nv_bfloat16{});
  else
    launch(__half{});
}

}  // namespace

void add_fused_cast_ste_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_cast_ste")
      .kernels.push_back({DeviceType::cuda, {DType::f16, DType::bf16}, fused_cast_ste_cuda});
}

}  // namespace qg
