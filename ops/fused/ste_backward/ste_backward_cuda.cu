// CUDA kernel of fused_ste_backward: dx = f(mask ? dy : +0, x) in one pass, one thread per
// mask byte (8 elements, one Pack8 of dy and of x). Per element it evaluates exactly what
// the two unfused kernels evaluate: ste_backward's select (dy's bits or +0, in the storage
// type) and then the activation's backward expression (ops/activation/activation_grad.cuh)
// on the math-type values, rounded once with from_math as map2_kernel rounds. So the fused
// node's output is bit-identical to ste_backward followed by the activation backward on the
// GPU; against the CPU it inherits the activation's tolerance (gelu/silu use CUDA's libm).
#include "core/graph.h"
#include "ops/activation/activation_grad.cuh"
#include "ops/activation/gelu_args.h"
#include "ops/common/cuda_vec.cuh"

namespace qg {
namespace {

using namespace cuda;

template <typename T, typename I, typename F>
__global__ void __launch_bounds__(kPackThreads)
    fused_ste_backward_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask,
                              const T* __restrict__ x, T* __restrict__ dx, int64_t n64, bool vec,
                              F f) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  const T zero = from_math<T>(0);
  auto element = [&](T d, unsigned bit, T xv) {
    const T masked = bit ? d : zero;
    return from_math<T>(f(to_math(masked), to_math(xv)));
  };
  struct In {
    Pack8<T> dy, x;
    unsigned bits;
  };
  auto load = [&](I b) { return In{load_pack(dy, b, vec), load_pack(x, b, vec), mask[b]}; };
  flat_packs<kPacksPerThread<T>>(nfull, load, [&](I b, const In& in) {
    Pack8<T> out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = element(in.dy.v[j], (in.bits >> j) & 1u, in.x.v[j]);
    store_pack(dx, b, vec, out);
  });
  // The last, partial mask byte: one thread.
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k)
      dx[k] = element(dy[k], (mask[nfull] >> (k - nfull * 8)) & 1u, x[k]);
}

template <typename F>
void launch(KernelContext& ctx, F f) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& x = ctx.inputs[2];
  Tensor& dx = ctx.outputs[0];
  const int64_t n = dx.numel();
  if (n == 0) return;
  const bool vec = aligned16(dy.raw_data()) && aligned16(x.raw_data()) && aligned16(dx.raw_data());
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      fused_ste_backward_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), in_ptr<T>(x), out_ptr<T>(dx), n, vec,
              f);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void fused_ste_backward_cuda(KernelContext& ctx) {
  const KernelPart& act = ctx.part(1);
  const std::string& name = act.op->name;
  if (name == "relu_backward") return launch(ctx, ReluBackwardF{});
  if (name == "silu_backward") return launch(ctx, SiluBackwardF{});
  QG_CHECK(name == "gelu_backward", ctx.op, "no CUDA kernel fuses ste_backward with ", name);
  if (act.args<GeluArgs>().tanh) return launch(ctx, GeluTanhBackwardF{});
  launch(ctx, GeluErfBackwardF{});
}

}  // namespace

void add_fused_ste_backward_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_backward")
      .kernels.push_back({DeviceType::cuda,
                          {DType::f32, DType::f64, DType::f16, DType::bf16},
                          fused_ste_backward_cuda});
}

}  // namespace qg
