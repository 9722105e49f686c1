// Fused observer + quantizer per tensor in delayed mode: the qparams come from the state
// before this batch, so every block quantizes its own contiguous run of packs while reducing
// it, in one pass over x whatever its size. The last block to finish (a ticket counter)
// folds the partials and updates the state (with the other ranks' ranges first, through the
// peer mailbox, in a data-parallel run).
#include "core/graph.h"
#include "ops/fused/observe_quantize/cuda_fast_path.cuh"

namespace qg::cuda::fused {
namespace {

constexpr int kUnroll = 4;  // packs in flight per thread

template <bool kCodes, typename T>
__global__ void __launch_bounds__(kThreads)
    fused_tensor_delayed_kernel(const T* x, void* y, uint32_t* mask, int64_t packs,
                                int64_t packs_per_block, MinMax* partials, unsigned* ticket,
                                FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  const P* xp = reinterpret_cast<const P*>(x);
  const Flags flags = read_flags(a);
  const Running old = read_state(a, 0);
  const UniformQP qp{update_and_qparams(a, flags, 0, old, minmax_identity(), false, false)};
  // The block's run of packs, indexed from its start in 32 bits (a run is far below 2^31;
  // signed, so that the compiler may fold j0 + u * kThreads into address offsets).
  const int64_t first = blockIdx.x * packs_per_block;
  const auto count =
      static_cast<int>((first + packs_per_block < packs ? first + packs_per_block : packs) - first);
  const P* xb = xp + first;
  void* yb = static_cast<char*>(y) + first * (kCodes ? N : int64_t{sizeof(P)});
  uint32_t* mb = mask + first * N / 32;  // first is a multiple of kThreads packs
  // Raw-bit statistics while the thread's packs are finite; from the first group of packs
  // holding a NaN or an infinity on, exact statistics and the exact quantize path.
  RawMinMax raw = raw_identity<T>();
  MinMax m = minmax_identity();
  bool dirty = false;
  const bool qp_ok = qps_fast<kCodes>(qp) && range_fast(a.qmin, a.qmax);
  // kUnroll packs per thread in flight; `kFull` groups need no bounds checks. count is a
  // multiple of 32, so every bound is uniform per warp.
  auto group = [&](int j0, auto full) {
    constexpr bool kFull = decltype(full)::value;
    auto in = [&](int u) { return kFull || j0 + u * kThreads < count; };
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (in(u)) v[u] = xb[j0 + u * kThreads];
    bool fast = false;
    if (!dirty) {
      RawMinMax next = raw;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (in(u)) raw_add(next, v[u]);
      fast = raw_clean<T>(next);
      if (fast) raw = next;
      dirty = !fast;
    }
    if (!fast) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (in(u)) exact_add(m, v[u]);
    }
    fast = fast && qp_ok;
    uint32_t* words = mb + static_cast<uint32_t>(j0) / (32 / N);  // pack u: + u * kThreads * N / 32
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kThreads;
      if (!in(u)) break;
      uint32_t bits = quantize_pack<kCodes>(fast, v[u], yb, j, qp, a.qmin, a.qmax);
      store_mask_word<N>(words + u * (kThreads * N / 32), bits, true);
    }
  };
  int j0 = static_cast<int>(threadIdx.x);
  for (; j0 + (kUnroll - 1) * kThreads < count; j0 += kUnroll * kThreads)
    group(j0, std::true_type{});
  if (j0 < count) group(j0, std::false_type{});
  m = combine(m, raw_minmax<T>(raw));
  MinMax bm = block_minmax(m);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = bm;
    __threadfence();  // the partial is visible before the ticket is taken
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  MinMax all = minmax_identity();
  for (int64_t p = threadIdx.x; p < gridDim.x; p += blockDim.x) {
    volatile const MinMax* vp = partials + p;  // written by other blocks
    MinMax o{vp->mn, vp->mx, vp->zeros, vp->nonfinite};
    all = combine(all, o);
  }
  all = block_minmax(all);
  // Data parallelism: the last block alone exchanges this rank's range for the ranks'.
  if (a.peers.ranks > 1)
    all = peer_combine(a, threadIdx.x == 0 ? peer_next_exchange(a.peers) : 0, all, true);
  all = finish(all);
  if (threadIdx.x == 0) {
    update_and_qparams(a, flags, 0, old, all, packs > 0, true);
    *ticket = 0;
  }
}

}  // namespace

bool launch_fused_tensor_delayed(KernelContext& ctx, const FusedArgs& a, bool codes) {
  const Tensor& x = ctx.inputs[0];
  return dispatch_codes_dtype(codes, x.dtype(), [&](auto codes_tag, auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int N = kVec<T>;
    const int64_t n = x.numel();
    if (n == 0 || n % (32 * N) != 0) return false;
    const int64_t packs = n / N;
    // Four resident blocks per multiprocessor, each streaming one contiguous run of packs
    // (a multiple of kThreads packs, so every warp is whole).
    const int64_t blocks_wanted = 4 * int64_t{multiprocessor_count()};
    int64_t per = (packs + blocks_wanted - 1) / blocks_wanted;
    per = (per + kThreads - 1) / kThreads * kThreads;
    const auto grid = static_cast<unsigned>((packs + per - 1) / per);
    const Device dev = x.device();
    auto stream = cuda_stream(ctx.device);
    Tensor partials = Tensor::empty({static_cast<int64_t>(grid * sizeof(MinMax))}, DType::u8, dev);
    Tensor ticket = Tensor::empty({1}, DType::i32, dev);
    QG_CUDA_CHECK("fused_observe_quantize",
                  cudaMemsetAsync(ticket.raw_data(), 0, sizeof(unsigned), stream));
    fused_tensor_delayed_kernel<decltype(codes_tag)::value, T><<<grid, kThreads, 0, stream>>>(
        in_ptr<T>(x), ctx.outputs[0].raw_data(), out_ptr<uint32_t>(ctx.outputs[1]), packs, per,
        out_ptr<MinMax>(partials), out_ptr<unsigned>(ticket), a);
    QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
    return true;
  });
}

}  // namespace qg::cuda::fused
