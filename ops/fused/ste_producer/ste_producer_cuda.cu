// CUDA kernels of fused_ste_producer: dx[k] = mask bit k ? producer element k : +0, in one
// pass. Bit for bit the unfused pair on the GPU, because each element is what the two
// unfused kernels store:
// - the producer's element: a permute or transpose moves the element's bits (the gathers of
//   ops/shape/permute_gather.cuh: unsigned integers of the element's size, or whole packs of
//   8); an add computes from_math<T>(to_math(a) + to_math(b)), map2_kernel's expression with
//   AddF (ops/arith), one rounding from the math type, NaN encoding included;
// - ste_backward's select (ops/fake_quantize): element k of the reshape views is element k
//   of the producer's contiguous output, and its mask bit is bit k % 8 of byte k / 8
//   (ops/common/bitmask.h). Set: the element's bits unchanged (a select of registers, no
//   float operation, so NaN payloads, -0 and infinities pass as they are); clear: +0, the
//   all-zero bit pattern in every float dtype (from_math<T>(0), an integer 0, or 16-bit
//   words ANDed with pair_mask, exactly as ste_backward_kernel does).
// Permutes take one of three routes: the tile transpose of the permute kernel with the
// masked store (a batched swap of the last two axes); packs of 8 when the innermost axis
// stays innermost with a run and source strides that are multiples of 8 (one mask byte and one
// gather per pack: attention's head merge [B, H, S, D] -> [B, S, H, D] with D = 64); else the
// permute's per-element gather with the masked store.
// SASS (sm_90, 32-bit index, attention's rank-4 plan, counted from the dump): f32 packs 198
// instructions per pack of 8 with the thread's setup (24.75/element) vs 120 per 16-byte unit
// of the permute (30/element) + 4.50 of ste_backward; bf16 about 333 per thread of two packs
// (20.8/element) vs 15 + 2.62-3.12: a little more issue for 16-bit types, but half the
// bytes moved (the permute's output is never written and read back). Add, load-to-store
// route: f32 7.25/element vs 5.00 (add) + 4.50; bf16 13.75-14.50 vs 11.38 + 2.62-3.12.
#include "core/graph.h"
#include "ops/common/cuda_vec.cuh"
#include "ops/fake_quantize/fake_quant_pack16.cuh"
#include "ops/fused/ste_producer/ste_producer.h"
#include "ops/shape/permute_gather.cuh"

namespace qg {
namespace {

using namespace cuda;

// The permute's store with ste_backward's select: element k or +0 (all bits clear).
struct MaskedStore {
  const uint8_t* __restrict__ mask;
  template <typename E, typename I>
  __device__ __forceinline__ void operator()(E* __restrict__ dst, I k, E v) const {
    dst[k] = (mask[k >> 3] >> (k & 7)) & 1u ? v : E(0);
  }
};

// Output pack p (elements 8p .. 8p+7, mask byte p) is source pack gather_offset(g, p): g is the
// permute plan in units of 8 elements (see as_packs_of_8).
template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    masked_permute_packs_kernel(const T* __restrict__ src, const uint8_t* __restrict__ mask,
                                T* __restrict__ dx, int64_t npacks64, GatherDims g, bool vec) {
  struct In {
    Pack8<T> v;
    unsigned bits;
  };
  auto load = [&](I p) { return In{load_pack(src, gather_offset(g, p), vec), mask[p]}; };
  flat_packs<kPacksPerThread<T>>(static_cast<I>(npacks64), load, [&](I p, const In& in) {
    store_pack(dx, p, vec, masked_pack(in.v, in.bits));
  });
}

// dx = mask ? a + b : +0 over same-shape operands, one thread per mask byte (a Pack8 of a and
// of b); the last, partial mask byte by one thread.
template <typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    masked_add_kernel(const T* __restrict__ a, const T* __restrict__ b,
                      const uint8_t* __restrict__ mask, T* __restrict__ dx, int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  auto sum = [](T x, T y) { return from_math<T>(to_math(x) + to_math(y)); };
  struct In {
    Pack8<T> a, b;
    unsigned bits;
  };
  auto load = [&](I p) { return In{load_pack(a, p, vec), load_pack(b, p, vec), mask[p]}; };
  flat_packs<kPacksPerThread<T>>(nfull, load, [&](I p, const In& in) {
    Pack8<T> s;
#pragma unroll
    for (int j = 0; j < 8; ++j) s.v[j] = sum(in.a.v[j], in.b.v[j]);
    store_pack(dx, p, vec, masked_pack(s, in.bits));
  });
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const T zero = from_math<T>(0);
    for (I k = nfull * 8; k < n; ++k)
      dx[k] = (mask[nfull] >> (k - nfull * 8)) & 1u ? sum(a[k], b[k]) : zero;
  }
}

void launch_add(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const Tensor& b = ctx.inputs[2];
  Tensor& dx = ctx.outputs[0];
  const int64_t n = dx.numel();
  const bool vec = aligned16(a.raw_data()) && aligned16(b.raw_data()) && aligned16(dx.raw_data());
  dispatch_float(a.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      masked_add_kernel<T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(a), in_ptr<T>(b), in_ptr<uint8_t>(ctx.inputs[1]), out_ptr<T>(dx), n, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

// When the innermost axis stays innermost with a run of a multiple of 8 elements and every
// other source stride is a multiple of 8, each output pack of 8 (one mask byte) is 8
// consecutive source elements starting at a multiple of 8: rewrites g in units of 8 elements.
bool as_packs_of_8(const PermutePlan& plan, GatherDims& g) {
  const size_t r = plan.sizes.size();
  if (r == 0 || plan.src_strides[r - 1] != 1 || plan.sizes[r - 1] % 8 != 0) return false;
  for (size_t d = 0; d + 1 < r; ++d)
    if (plan.src_strides[d] % 8 != 0) return false;
  g.sizes[r - 1] = plan.sizes[r - 1] / 8;
  for (size_t d = 0; d + 1 < r; ++d) g.src_strides[d] = plan.src_strides[d] / 8;
  return true;
}

void launch_permute(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const KernelPart& producer = ctx.part(0);
  const int64_t n = ctx.outputs[0].numel();
  const PermutePlan& plan = producer.args<PermuteArgs>().plan;
  GatherDims g = gather_dims(ctx.op, plan, a);
  const MaskedStore store{in_ptr<uint8_t>(ctx.inputs[1])};
  int64_t batches = 0, rows = 0, cols = 0;
  if (!as_tiled_transpose(plan, batches, rows, cols) && as_packs_of_8(plan, g)) {
    const bool vec = aligned16(a.raw_data()) && aligned16(ctx.outputs[0].raw_data());
    dispatch_float(a.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(n, [&](auto itag) {
        masked_permute_packs_kernel<T, decltype(itag)>
            <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
                in_ptr<T>(a), store.mask, out_ptr<T>(ctx.outputs[0]), n / 8, with_divisors(g), vec);
      });
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
    return;
  }
  switch (dtype_size(a.dtype())) {
    case 2:
      return launch_gather<uint16_t>(ctx, plan, g, n, store);
    case 4:
      return launch_gather<uint32_t>(ctx, plan, g, n, store);
    case 8:
      return launch_gather<uint64_t>(ctx, plan, g, n, store);
    default:
      QG_FAIL(ctx.op, "no kernel for elements of ", dtype_size(a.dtype()), " bytes (",
              dtype_name(a.dtype()), ")");
  }
}

void fused_ste_producer_cuda(KernelContext& ctx) {
  check_fused_ste_producer_inputs(ctx);
  if (ctx.outputs[0].numel() == 0) return;
  if (ctx.part(0).op->name == "add") return launch_add(ctx);
  launch_permute(ctx);
}

}  // namespace

void add_fused_ste_producer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_producer")
      .kernels.push_back({DeviceType::cuda,
                          {DType::f32, DType::f64, DType::f16, DType::bf16},
                          fused_ste_producer_cuda});
}

}  // namespace qg
