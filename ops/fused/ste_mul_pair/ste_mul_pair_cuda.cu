// CUDA kernel of fused_ste_mul_pair: per element k, m = mask bit k ? dy[k] : +0, then
// ya[k] = m * a[k] and yb[k] = m * b[k], in one pass: one thread per mask byte (a Pack8 of dy,
// of a and of b), several packs a thread in flight (ops/common/cuda_vec.cuh). Bit for bit the
// unfused kernels on the GPU:
// - ste_backward's select: masked_pack (ops/fake_quantize/fake_quant_pack16.cuh), which every
//   fused STE kernel shares: dy's bits when the bit is set, else +0 (all bits clear); element k
//   of the reshape views is element k of dy, and its bit is bit k % 8 of byte k / 8;
// - mul's expression: map2_kernel with MulF (ops/arith/arith_cuda.cu), from_math<T> of the
//   product of the two math-type values, in the mul's own operand order (a_slot, b_slot).
#include "core/graph.h"
#include "ops/common/cuda_vec.cuh"
#include "ops/fake_quantize/fake_quant_pack16.cuh"
#include "ops/fused/ste_mul_pair/ste_mul_pair.h"
#include "ops/fused/ste_mul_pair/ste_mul_pair_args.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T>
__device__ __forceinline__ T product(T masked, T other, bool masked_first) {
  return masked_first ? from_math<T>(to_math(masked) * to_math(other))
                      : from_math<T>(to_math(other) * to_math(masked));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    ste_mul_pair_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask,
                        const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ ya,
                        T* __restrict__ yb, int64_t n64, bool a_first, bool b_first, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  struct In {
    Pack8<T> dy, a, b;
    unsigned bits;
  };
  auto load = [&](I p) {
    return In{load_pack(dy, p, vec), load_pack(a, p, vec), load_pack(b, p, vec), mask[p]};
  };
  flat_packs<kPacksPerThread<T>>(nfull, load, [&](I p, const In& in) {
    const Pack8<T> m = masked_pack(in.dy, in.bits);
    Pack8<T> ra, rb;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      ra.v[j] = product(m.v[j], in.a.v[j], a_first);
      rb.v[j] = product(m.v[j], in.b.v[j], b_first);
    }
    store_pack(ya, p, vec, ra);
    store_pack(yb, p, vec, rb);
  });
  // The last, partial mask byte: one thread.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const T zero = from_math<T>(0);
    for (I k = nfull * 8; k < n; ++k) {
      const T m = (mask[nfull] >> (k - nfull * 8)) & 1u ? dy[k] : zero;
      ya[k] = product(m, a[k], a_first);
      yb[k] = product(m, b[k], b_first);
    }
  }
}

void fused_ste_mul_pair_cuda(KernelContext& ctx) {
  check_fused_ste_mul_pair(ctx);
  const Tensor& dy = ctx.inputs[0];
  const Tensor& a = ctx.inputs[2];
  const Tensor& b = ctx.inputs[3];
  Tensor& ya = ctx.outputs[0];
  Tensor& yb = ctx.outputs[1];
  const int64_t n = dy.numel();
  if (n == 0) return;
  const bool vec = aligned16(dy.raw_data()) && aligned16(a.raw_data()) && aligned16(b.raw_data()) &&
                   aligned16(ya.raw_data()) && aligned16(yb.raw_data());
  const SteMulPairArgs& args = ctx.args<SteMulPairArgs>();
  const bool a_first = args.a_first, b_first = args.b_first;
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      ste_mul_pair_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), in_ptr<T>(a), in_ptr<T>(b),
              out_ptr<T>(ya), out_ptr<T>(yb), n, a_first, b_first, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_fused_ste_mul_pair_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_mul_pair")
      .kernels.push_back({DeviceType::cuda,
                          {DType::f32, DType::f64, DType::f16, DType::bf16},
                          fused_ste_mul_pair_cuda});
}

}  // namespace qg
