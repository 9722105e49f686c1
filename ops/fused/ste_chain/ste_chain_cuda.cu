// CUDA kernel of fused_ste_chain: ste_backward's kernel (one thread per mask byte, 8
// elements, one Pack8 of dy; 16-bit types as 32-bit words ANDed with pair_mask) with the
// byte's bits the AND of the two masks' bytes. Per element it stores dy's bits or +0, exactly
// what the second of two ste_backward kernels stores (ste_chain_op.cpp says why the AND
// is the pair), so the fused node is bit-identical to the pair on the GPU and to the CPU.
// SASS (sm_90, per element of a pack): f32 5.00 vs 2 x 4.50 for the pair, f64 6.12 vs
// 2 x 5.62, bf16/f16 2.75-3.25 vs 2 x 2.62-3.12.
#include "core/graph.h"
#include "ops/common/cuda_vec.cuh"
#include "ops/fake_quantize/fake_quant_pack16.cuh"
#include "ops/fused/ste_chain/ste_chain.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    fused_ste_chain_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ first,
                           const uint8_t* __restrict__ second, T* __restrict__ dx, int64_t n64,
                           bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  const T zero = from_math<T>(0);
  struct In {
    Pack8<T> v;
    unsigned bits;
  };
  auto load = [&](I b) {
    return In{load_pack(dy, b, vec), static_cast<unsigned>(first[b] & second[b])};
  };
  flat_packs<kPacksPerThread<T>>(
      nfull, load, [&](I b, const In& in) { store_pack(dx, b, vec, masked_pack(in.v, in.bits)); });
  // The last, partial mask byte: one thread.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned bits = first[nfull] & second[nfull];
    for (I k = nfull * 8; k < n; ++k) dx[k] = (bits >> (k - nfull * 8)) & 1u ? dy[k] : zero;
  }
}

void fused_ste_chain_cuda(KernelContext& ctx) {
  check_fused_ste_chain_inputs(ctx);
  const Tensor& dy = ctx.inputs[0];
  Tensor& dx = ctx.outputs[0];
  const int64_t n = dx.numel();
  if (n == 0) return;
  const bool vec = aligned16(dy.raw_data()) && aligned16(dx.raw_data());
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      fused_ste_chain_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), in_ptr<uint8_t>(ctx.inputs[2]),
              out_ptr<T>(dx), n, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_fused_ste_chain_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_chain")
      .kernels.push_back({DeviceType::cuda,
                          {DType::f32, DType::f64, DType::f16, DType::bf16},
                          fused_ste_chain_cuda});
}

}  // namespace qg
