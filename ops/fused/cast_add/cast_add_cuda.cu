// CUDA kernel of fused_cast_add: y = f32(a) + f32(b) in packs of 8 elements (whole 16-byte
// loads and stores, ops/common/cuda_vec.cuh), each operand read in its own dtype. Widening
// with to_math is the cast kernel's own conversion (exact, NaN payloads kept) and the f32 add
// rounds once, so the result is the unfused cast + add's bit for bit, and the CPU kernel's.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/fused/cast_add/cast_add.h"

namespace qg {
namespace {

using namespace cuda;

template <typename T>
__device__ __forceinline__ float widen(T v) {
  return static_cast<float>(to_math(v));
}

// Two packs of 16-bit operands (or one of f32) a thread, as the cast kernel streams them.
template <typename A, typename B>
inline constexpr int kPacks = (sizeof(A) == 2 && sizeof(B) == 2) ? 2 : 1;

template <typename A, typename B, typename I>
__global__ void __launch_bounds__(kPackThreads)
    cast_add_kernel(const A* __restrict__ a, const B* __restrict__ b, float* __restrict__ y,
                    int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  struct Loaded {
    Pack8<A> a;
    Pack8<B> b;
  };
  flat_packs<kPacks<A, B>>(
      nfull,
      [&](I p) {
        return Loaded{load_pack(a, p, vec), load_pack(b, p, vec)};
      },
      [&](I p, const Loaded& v) {
        Pack8<float> r;
#pragma unroll
        for (int j = 0; j < 8; ++j) r.v[j] = widen(v.a.v[j]) + widen(v.b.v[j]);
        store_pack(y, p, vec, r);
      });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) y[k] = widen(a[k]) + widen(b[k]);
}

// f32, bf16 or f16 (what check_fused_cast_add_inputs admits).
template <typename Fn>
void dispatch_operand(DType d, const std::string& op, Fn&& fn) {
  switch (d) {
    case DType::f32:
      return fn(float{});
    case DType::bf16:
      return fn(__nv_bfloat16{});
    case DType::f16:
      return fn(__half{});
    default:
      QG_FAIL(op, "no kernel for an operand of dtype ", dtype_name(d));
  }
}

void fused_cast_add_cuda(KernelContext& ctx) {
  check_fused_cast_add_inputs(ctx);
  const Tensor &a = ctx.inputs[0], &b = ctx.inputs[1];
  Tensor& y = ctx.outputs[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  const bool vec = aligned16(a.raw_data()) && aligned16(b.raw_data()) && aligned16(y.raw_data());
  dispatch_operand(a.dtype(), ctx.op, [&](auto ta) {
    dispatch_operand(b.dtype(), ctx.op, [&](auto tb) {
      using A = decltype(ta);
      using B = decltype(tb);
      dispatch_index(n, [&](auto itag) {
        cast_add_kernel<A, B, decltype(itag)>
            <<<pack_blocks<kPacks<A, B>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
                in_ptr<A>(a), in_ptr<B>(b), out_ptr<float>(y), n, vec);
      });
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  });
}

}  // namespace

void add_fused_cast_add_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_cast_add")
      .kernels.push_back(
          {DeviceType::cuda, {DType::f32, DType::f16, DType::bf16}, fused_cast_add_cuda});
}

}  // namespace qg
