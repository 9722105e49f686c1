// Fused observer + quantizer when every qparam covers one contiguous row of x (channels of
// the outermost axis, tokens, groups along the innermost axis): the row is loaded once into
// registers, reduced, one warp computes the qparams (one thread also writes the state), and
// the row is quantized from registers. One pass over x, one launch, no host sync.
#include "core/graph.h"
#include "ops/fused/observe_quantize/cuda_fast_path.cuh"

namespace qg::cuda::fused {
namespace {

constexpr int kRowPacks = 4;  // packs per thread a row may need (rows up to 1024 packs)

// Block sizes of the one-row-per-block kernel: half blocks for rows of up to half the
// packs, so that each thread holds up to kRowPacks packs and the per-row work (the block
// reduction, the qparams) is spread over more elements (bf16[8192, 4096]: 4 packs of 8 per
// thread instead of 2). 16-bit types only: f32 rows run slower in half blocks (H100:
// [2048, 2048] 3.21x the copy against 1.38x in full blocks), so f32 keeps full blocks,
// except where half blocks save a second wave (launch_rows). Measurements:
// bench/results/fused_observe_quantize_tuning.md.
constexpr int kHalfBlock = kThreads / 2;
constexpr int kHalfBlocksPerSm = 8;  // the same register budget as 4 full blocks
// Full blocks resident per multiprocessor the register budget must allow: 5 (48 registers,
// no spill) is the fastest (H200, per-channel f32[8192, 4096]: 1.11x the copy, against 1.19x
// with 4 and 1.20x with 6, which spills).
constexpr int kFullBlocksPerSm = 5;
// Rows of 129..256 packs (a transformer's [*, 768] f32 weights: 192 packs) go to a warp
// each, 8 packs per lane, when there are enough rows to fill the device with warps (H200:
// f32[3072, 768] 12.9 us against 16.5-18 us as blocks); otherwise a block per row spreads
// each row over more threads (H100: [768, 768] 8.2 us as blocks, 13.2 us as warps).
constexpr int kWarpRowPacks = 8;
constexpr int kManyRowsPerSm = 16;

template <int kBlock, typename T, int N>
__device__ __forceinline__ void load_row(const Pack<T, N>* xr, int packs,
                                         Pack<T, N> (&r)[kRowPacks]) {
#pragma unroll
  for (int u = 0; u < kRowPacks; ++u) {
    const int j = static_cast<int>(threadIdx.x) + u * kBlock;
    if (j < packs) r[u] = xr[j];
  }
}

// Reduces, updates and quantizes one row held in registers by the block (kLanes threads) or
// by a warp (32 lanes); `resolve` turns the warps' statistics into the row's qparams (the
// block reduction and the observer update).
template <bool kCodes, int kLanes, typename T, int N, int kP, typename Resolve>
__device__ __forceinline__ void quantize_row(const Pack<T, N> (&cur)[kP], int lane, void* y,
                                             uint32_t* mask, int64_t row, int64_t packs_per_row,
                                             const FusedArgs& a, Resolve resolve) {
  // The raw-bit statistics; a thread that holds a NaN or an infinity redoes them exactly
  // and quantizes on the exact path.
  const int ppr = static_cast<int>(packs_per_row);  // at most kThreads * kRowPacks
  RawMinMax raw = raw_identity<T>();
#pragma unroll
  for (int u = 0; u < kP; ++u)
    if (lane + u * kLanes < ppr) raw_add(raw, cur[u]);
  const bool clean = raw_clean<T>(raw);
  // The warp's statistics (in every lane): reduced as raw bits when all its lanes are clean.
  MinMax m;
  if (__all_sync(0xffffffffu, clean)) {
    m = raw_minmax<T>(raw_lanes_reduce<T>(raw, 32));
  } else {
    m = minmax_identity();
    if (clean) {
      m = raw_minmax<T>(raw);
    } else {
#pragma unroll
      for (int u = 0; u < kP; ++u)
        if (lane + u * kLanes < ppr) exact_add(m, cur[u]);
    }
    m = warp_reduce(m);
  }
  const UniformQP qp = resolve(m);
  const bool fast = clean && qps_fast<kCodes>(qp) && range_fast(a.qmin, a.qmax);
  // The row's outputs, indexed from the row start in 32 bits (a row is at most
  // kThreads * kRowPacks packs and a whole number of mask words).
  const int64_t first = row * packs_per_row;
  void* yr = static_cast<char*>(y) + first * (kCodes ? N : int64_t{sizeof(Pack<T, N>)});
  uint32_t* mr = mask + first * N / 32;
#pragma unroll
  for (int u = 0; u < kP; ++u) {
    const int j = lane + u * kLanes;
    bool active = j < ppr;
    uint32_t bits = 0;
    if (active) bits = quantize_pack<kCodes>(fast, cur[u], yr, j, qp, a.qmin, a.qmax);
    if (__any_sync(0xffffffffu, active)) store_mask_bits<N>(mr, j, bits, active);
  }
}

// The qparams of the block's row from each thread's statistics: warp 0 alone folds the
// warps' partials and runs the observer update (the other warps wait at the barrier instead
// of repeating it: ~100 instructions per warp) and shares the result.
template <int kBlock>
__device__ __forceinline__ UniformQP block_qparams(const MinMax& m, const FusedArgs& a, int64_t row,
                                                   const Running& old, const Flags& flags) {
  constexpr int kWarps = kBlock / 32;
  __shared__ MinMax warps[kWarps];
  __shared__ QP result;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    // Lanes below kWarps hold the partials; lane 0 ends with all of them.
    MinMax w = lanes_reduce(lane < kWarps ? warps[lane] : minmax_identity(), kWarps);
    const QP qp = update_and_qparams(a, flags, row, old, finish(w), true, lane == 0);
    if (lane == 0) result = qp;
  }
  __syncthreads();
  return {result};  // one row per block: no later write to `result`
}

// One block per row, no more: a block needs its whole row before it can quantize any of it,
// so rows are not prefetched; instead many blocks are resident (small register budget) and
// hide each other's barriers and reductions. Measured on an H100 against a persistent grid
// that walks runs of rows and prefetches the next one: 0.91x vs 1.07x copy for obs+quantize
// per-channel f32[8192, 4096], 2.08x vs 2.74x for obs+fq bf16[8192, 4096].
template <bool kCodes, typename T, int kBlock, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    fused_rows_kernel(const T* x, void* y, uint32_t* mask, int64_t packs_per_row, FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  const int64_t row = blockIdx.x;
  // Warp 0 reads the row's observer state and the flags before the row itself, so their
  // latency overlaps the row's loads instead of following the block reduction (H200,
  // per-channel f32[8192, 4096]: 1.39x -> 1.19x copy; bf16 1.49x -> 1.22x).
  Running old{};
  Flags flags{};
  if (threadIdx.x < 32) {
    old = read_state(a, row);
    flags = read_flags(a);
  }
  P cur[kRowPacks];
  load_row<kBlock>(reinterpret_cast<const P*>(x) + row * packs_per_row,
                   static_cast<int>(packs_per_row), cur);
  quantize_row<kCodes, kBlock>(
      cur, threadIdx.x, y, mask, row, packs_per_row, a,
      [&](const MinMax& m) { return block_qparams<kBlock>(m, a, row, old, flags); });
}

// Short rows (per-group qparams, short tokens or channels: up to 32 * kP packs): one
// warp per row, reduced with shuffles, so a block works on eight rows at once and never
// waits at a barrier. Lane 0 writes the state.
template <bool kCodes, typename T, int kP>
__global__ void __launch_bounds__(kThreads, 3)
    fused_warp_rows_kernel(const T* x, void* y, uint32_t* mask, int64_t rows, int64_t packs_per_row,
                           FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  const P* xp = reinterpret_cast<const P*>(x);
  const Flags flags = read_flags(a);
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  for (int64_t row = global_thread() / 32; row < rows; row += warps) {
    const Running state = read_state(a, row);  // in flight with the row's loads
    P cur[kP];
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      int64_t j = lane + int64_t{u} * 32;
      if (j < packs_per_row) cur[u] = xp[row * packs_per_row + j];
    }
    quantize_row<kCodes, 32>(cur, lane, y, mask, row, packs_per_row, a, [&](const MinMax& m) {
      return UniformQP{update_and_qparams(a, flags, row, state, finish(m), true, lane == 0)};
    });
  }
}

// The blocks of `kernel` (of `block` threads) resident at once on the device.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int block = kThreads) {
  int per_sm = 0;
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0));
  return int64_t{multiprocessor_count()} * std::max(per_sm, 1);
}

template <bool kCodes, typename T, int kP>
void launch_warp_rows(const T* x, void* y, uint32_t* mask, const FusedArgs& a, int64_t rows,
                      int64_t packs_per_row, cudaStream_t stream) {
  static const int64_t cap = resident_blocks(fused_warp_rows_kernel<kCodes, T, kP>);
  auto grid = static_cast<unsigned>(std::min<int64_t>(cap, (rows + 7) / 8));
  fused_warp_rows_kernel<kCodes, T, kP>
      <<<grid, kThreads, 0, stream>>>(x, y, mask, rows, packs_per_row, a);
}

template <bool kCodes, typename T, int kBlock, int kMinBlocks>
void launch_block_rows(const T* x, void* y, uint32_t* mask, const FusedArgs& a, int64_t rows,
                       int64_t packs_per_row, cudaStream_t stream) {
  fused_rows_kernel<kCodes, T, kBlock, kMinBlocks>
      <<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(x, y, mask, packs_per_row, a);
}

template <bool kCodes, typename T>
void launch_rows(const T* x, void* y, uint32_t* mask, const FusedArgs& a, int64_t rows,
                 int64_t packs_per_row, cudaStream_t stream) {
  static const int64_t many_rows = int64_t{kManyRowsPerSm} * multiprocessor_count();
  static const int64_t full_wave =
      resident_blocks(fused_rows_kernel<kCodes, T, kThreads, kFullBlocksPerSm>);
  static const int64_t half_wave =
      resident_blocks(fused_rows_kernel<kCodes, T, kHalfBlock, kHalfBlocksPerSm>, kHalfBlock);
  // f32 rows that need a second wave of full blocks but fit one wave of half blocks take
  // half blocks: the second wave of a block per row is a whole row latency more (H200:
  // per-channel f32[1000, 2048] 1.05x the copy against 1.47x).
  const bool one_half_wave = rows > full_wave && rows <= half_wave;
  if (packs_per_row <= 32 * kRowPacks) {
    // Short rows: a persistent grid of warps walks the rows (occupancy looked up once).
    launch_warp_rows<kCodes, T, kRowPacks>(x, y, mask, a, rows, packs_per_row, stream);
  } else if (packs_per_row <= 32 * kWarpRowPacks && rows >= many_rows) {
    launch_warp_rows<kCodes, T, kWarpRowPacks>(x, y, mask, a, rows, packs_per_row, stream);
  } else if ((sizeof(T) == 2 || one_half_wave) && packs_per_row <= kHalfBlock * kRowPacks) {
    launch_block_rows<kCodes, T, kHalfBlock, kHalfBlocksPerSm>(x, y, mask, a, rows, packs_per_row,
                                                               stream);
  } else {
    launch_block_rows<kCodes, T, kThreads, kFullBlocksPerSm>(x, y, mask, a, rows, packs_per_row,
                                                             stream);
  }
  QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
}

}  // namespace

bool launch_fused_rows(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t rows,
                       int64_t row_len) {
  const Tensor& x = ctx.inputs[0];
  return dispatch_codes_dtype(codes, x.dtype(), [&](auto codes_tag, auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int N = kVec<T>;
    // Rows of whole 32-bit mask words (so rows never share a word) that fit in registers.
    if (row_len <= 0 || row_len % 32 != 0 || row_len / N > int64_t{kThreads} * kRowPacks ||
        rows > INT32_MAX)
      return false;
    launch_rows<decltype(codes_tag)::value, T>(in_ptr<T>(x), ctx.outputs[0].raw_data(),
                                               out_ptr<uint32_t>(ctx.outputs[1]), a, rows,
                                               row_len / N, cuda_stream(ctx.device));
    return true;
  });
}

}  // namespace qg::cuda::fused
