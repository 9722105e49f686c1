// CUDA kernels of fused_swiglu and fused_swiglu_backward: the element math of the silu, mul
// and silu_backward kernels (activation_math.h with CUDA's expf; each result rounded to T
// where those kernels round it) in packs of 8 elements, so each equals the unfused kernels'
// result bit for bit.
#include "core/graph.h"
#include "ops/activation/activation_math.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/fused/swiglu/swiglu.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T>
__device__ __forceinline__ T silu_of(T g) {
  return from_math<T>(act::silu(to_math(g)));
}

template <typename T>
__device__ __forceinline__ T mul_of(T a, T b) {
  return from_math<T>(to_math(a) * to_math(b));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    swiglu_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ h, int64_t n64,
                  bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  struct In {
    Pack8<T> g, u;
  };
  flat_packs<kPacksPerThread<T>>(
      nfull,
      [&](I b) {
        return In{load_pack(g, b, vec), load_pack(u, b, vec)};
      },
      [&](I b, const In& in) {
        Pack8<T> r;
#pragma unroll
        for (int j = 0; j < 8; ++j) r.v[j] = mul_of(silu_of(in.g.v[j]), in.u.v[j]);
        store_pack(h, b, vec, r);
      });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) h[k] = mul_of(silu_of(g[k]), u[k]);
}

template <typename T>
__device__ __forceinline__ void swiglu_grad(T dh, T g, T u, T& dg, T& du) {
  const T ds = mul_of(dh, u);
  du = mul_of(dh, silu_of(g));
  dg = from_math<T>(to_math(ds) * act::silu_grad(to_math(g)));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    swiglu_backward_kernel(const T* __restrict__ dh, const T* __restrict__ g,
                           const T* __restrict__ u, T* __restrict__ dg, T* __restrict__ du,
                           int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  struct In {
    Pack8<T> dh, g, u;
  };
  flat_packs<1>(
      nfull,
      [&](I b) {
        return In{load_pack(dh, b, vec), load_pack(g, b, vec), load_pack(u, b, vec)};
      },
      [&](I b, const In& in) {
        Pack8<T> rg, ru;
#pragma unroll
        for (int j = 0; j < 8; ++j) swiglu_grad(in.dh.v[j], in.g.v[j], in.u.v[j], rg.v[j], ru.v[j]);
        store_pack(dg, b, vec, rg);
        store_pack(du, b, vec, ru);
      });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) swiglu_grad(dh[k], g[k], u[k], dg[k], du[k]);
}

bool all_aligned(const KernelContext& ctx) {
  for (const Tensor& t : ctx.inputs)
    if (!aligned16(t.raw_data())) return false;
  for (const Tensor& t : ctx.outputs)
    if (!aligned16(t.raw_data())) return false;
  return true;
}

void swiglu_cuda(KernelContext& ctx) {
  check_fused_swiglu_tensors(ctx);
  const int64_t n = ctx.outputs[0].numel();
  if (n == 0) return;
  const bool vec = all_aligned(ctx);
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      swiglu_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), out_ptr<T>(ctx.outputs[0]), n,
              vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void swiglu_backward_cuda(KernelContext& ctx) {
  check_fused_swiglu_tensors(ctx);
  const int64_t n = ctx.outputs[0].numel();
  if (n == 0) return;
  const bool vec = all_aligned(ctx);
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      swiglu_backward_kernel<T, decltype(itag)>
          <<<pack_blocks<1>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
              out_ptr<T>(ctx.outputs[0]), out_ptr<T>(ctx.outputs[1]), n, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_fused_swiglu_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_swiglu").kernels.push_back({DeviceType::cuda, kFloatDTypes, swiglu_cuda});
  r.get_mutable("fused_swiglu_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, swiglu_backward_cuda});
}

}  // namespace qg
