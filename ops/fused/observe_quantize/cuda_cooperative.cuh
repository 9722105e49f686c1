// Fused observer + quantizer as one cooperative (persistent) grid, for the layouts whose
// statistics need every block's share of x before anything can be quantized:
//  * per tensor: blocks publish partial (min, max) pairs, meet at a grid barrier, each folds
//    them in the same order and quantizes;
//  * per channel along the last axis of [rows, C] (e.g. per-feature activations): the grid
//    stride is a multiple of the row length, so every thread keeps reading the same few
//    channels. Threads publish per-channel partials, a grid barrier, groups of lanes fold
//    each channel and write its state and qparams, a second grid barrier, and every thread
//    reads the qparams of its channels and quantizes. Two phases, no host sync;
//  * per channel on a middle axis of [outer, C, inner]: the same two phases, with the
//    statistics policies and pack maps of cuda_cooperative_middle_axis.cuh.
// Each thread keeps up to kCached 16-byte packs in registers and as many more in shared
// memory as fit; the rest is streamed, and re-read in reverse order for the quantize phase,
// so the most recently read bytes are still in L2. A tensor that fits on chip is read once.
#pragma once

#include <cooperative_groups.h>

#include <map>
#include <mutex>
#include <numeric>

#include "core/graph.h"
#include "ops/fused/observe_quantize/cuda_fast_path.cuh"

namespace qg::cuda::fused::coop {

namespace cg = cooperative_groups;

// What the kernel applies to each pack of x as it loads it: nothing, or an element-wise
// activation that the fusion pass moved into the node (fuse_activation_prologue), evaluated
// per element exactly as the activation's own kernel does (from_math(f(to_math(v)))).
struct NoPrologue {
  template <typename P>
  __device__ __forceinline__ P operator()(const P& p) const {
    return p;
  }
};
template <typename F>
struct ActivationPrologue {
  template <typename T, int N>
  __device__ __forceinline__ Pack<T, N> operator()(Pack<T, N> p) const {
#pragma unroll
    for (int e = 0; e < N; ++e) p.v[e] = from_math<T>(F{}(to_math(p.v[e]), to_math(p.v[e])));
    return p;
  }
};

// A pack loaded with ld.global.cs (evict-first in L2), for every load whose bytes are not
// read from global memory again soon: the packs kept in registers and shared memory, the
// streamed packs on their second read, and (see l2_kept_sweeps) the streamed packs read
// before the last half-L2's worth. L2 then keeps the streamed packs re-read first. The
// first two take per-tensor obs+fq bf16[8192, 4096] from 1.52x to 1.40x the copy (H200; f32
// unchanged; bench/results/fused_observe_quantize_tuning.md).
template <typename P>
__device__ __forceinline__ P load_evict_first(const P* p) {
  static_assert(sizeof(P) == 16, "16-byte packs");
  const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
  P out;
  memcpy(&out, &v, sizeof out);
  return out;
}

constexpr int kCached = 4;  // packs per thread held in registers
constexpr int kUnroll = 4;  // streamed packs in flight per thread
// 24 warps keep enough loads in flight. Four blocks (a 64-register cap) spilled and measured
// slower on an H100: per-tensor f32[2048, 2048] 21.9 vs 20.7 us, last axis 38.4 vs 27.4 us.
constexpr int kBlocksPerSm = 3;
// Packs a launch may have: pack indices, up to packs plus a few grid strides, stay in int.
constexpr int64_t kMaxPacks = int64_t{1} << 30;

// The packs one thread reads: p = first + k * step for k = 0, 1, ... while p < end, the k-th
// at x[at(p)]. The kernel's loops step p, so a map whose index is not linear in k pays only
// for at(). Every lane of a warp must have the same trip count (the mask shuffles) and, for
// a mask word, 32 / N lanes with consecutive indices, the first a multiple of 32 / N
// (store_mask_bits). This one is the grid-stride sequence, p = global_thread() + k *
// global_stride() read at x[p]: the launches make packs and the grid a multiple of 32.
struct GridStridePacks {
  int first, step, end;
  __device__ __forceinline__ int at(int p) const { return p; }
};

__device__ __forceinline__ GridStridePacks grid_stride_packs(int packs) {
  return {static_cast<int>(global_thread()), static_cast<int>(global_stride()), packs};
}

// Per tensor: one (min, max) per thread, one partial per block, every block folds them all.
// The thread's statistics are raw-bit ones while its elements are finite (settle() redoes
// them exactly otherwise; `clean` then keeps the thread on the exact quantize path).
template <typename T>
struct TensorStats {
  static constexpr int N = kVec<T>;
  using QPs = UniformQP;
  struct Scratch {
    MinMax* partials;  // one per block
  };
  RawMinMax raw;
  MinMax m;
  bool clean;
  Running old;  // block 0 overwrites the state after the barrier

  __device__ void begin(const FusedArgs& a, const Scratch&) {
    raw = raw_identity<T>();
    old = read_state(a, 0);
  }
  __device__ GridStridePacks pack_map(const Scratch&, int packs) const {
    return grid_stride_packs(packs);
  }
  __device__ __forceinline__ void add(const Pack<T, N>& p) { raw_add(raw, p); }
  // Re-reads the thread's packs (`map`) when it saw a NaN or an infinity.
  template <typename Map, typename Pre>
  __device__ void settle(const Pack<T, N>* xp, const Map& map, Pre pre) {
    clean = raw_clean<T>(raw);
    if (clean) {
      m = raw_minmax<T>(raw);
      return;
    }
    m = minmax_identity();
    for (int p = map.first; p < map.end; p += map.step) exact_add(m, pre(xp[map.at(p)]));
  }
  __device__ QPs resolve(const FusedArgs& a, const Scratch& s, int64_t packs) {
    MinMax bm = block_minmax(m);
    if (threadIdx.x == 0) s.partials[blockIdx.x] = bm;
    // Data parallelism: the exchange is read before the barrier, after which block 0 advances it.
    const unsigned long long exchange =
        a.peers.ranks > 1 && threadIdx.x == 0 ? peer_next_exchange(a.peers) : 0;
    cg::this_grid().sync();
    // Every block folds all partials the same way, so all agree without a second barrier;
    // only block 0 writes the state and the qparams.
    MinMax all = minmax_identity();
    for (int64_t p = threadIdx.x; p < gridDim.x; p += blockDim.x) all = combine(all, s.partials[p]);
    all = block_minmax(all);
    // With the ranks' ranges: block 0 publishes, every block folds every rank's (still the one
    // pass over x: the registers and shared memory keep their packs meanwhile).
    if (a.peers.ranks > 1) all = peer_combine(a, exchange, all, blockIdx.x == 0);
    all = finish(all);
    return {update_and_qparams(a, read_flags(a), 0, old, all, packs > 0,
                               blockIdx.x == 0 && threadIdx.x == 0)};
  }
};

__device__ __forceinline__ void store_partial(ColumnMinMax* p, const ColumnMinMax& m) {
  *reinterpret_cast<uint4*>(p) =
      make_uint4(__float_as_uint(m.mn), __float_as_uint(m.mx), m.zeros, m.nonfinite);
}

__device__ __forceinline__ ColumnMinMax load_partial(const ColumnMinMax* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return {__uint_as_float(v.x), __uint_as_float(v.y), v.z, v.w};
}

// The fold of the two-phase kernels: `lanes` consecutive lanes per channel (a power of two
// <= 32), each over a strided share of the channel's `per_channel` partials (partial(c, i)
// is the i-th), then shuffles; the group's first lane writes the state and the qparams.
// Every thread of the grid calls this: the trip count is the same for the whole warp, as
// the shuffles need every lane.
template <typename PartialOf>
__device__ void fold_channels(const FusedArgs& a, const Flags& flags, int64_t channels, int lanes,
                              int64_t per_channel, PartialOf partial) {
  const int64_t t = global_thread(), groups = global_stride() / lanes;
  const int sub = static_cast<int>(t % lanes);
  for (int64_t c0 = 0; c0 < channels; c0 += groups) {
    const int64_t c = c0 + t / lanes;
    const bool active = c < channels;
    MinMax acc = minmax_identity();
    if (active)
#pragma unroll 4
      for (int64_t i = sub; i < per_channel; i += lanes)
        acc = combine(acc, load_partial(partial(c, i)));
    acc = lanes_reduce(acc, lanes);
    if (active && sub == 0)
      update_and_qparams(a, flags, c, read_state(a, c), finish(acc), true, true);
  }
}

// Per channel along the last axis: thread t always reads channels (t % P) * N + [0, N).
template <typename T>
struct ColumnStats {
  static constexpr int N = kVec<T>;
  using QPs = ColumnQP<N>;
  struct Scratch {
    ColumnMinMax* partials;  // [sweeps][columns]: sweep t / P, slot (c % N) * P + c / N
    int64_t columns;         // C
    int fold_lanes;          // lanes that fold one channel (a power of two <= 32)
  };
  ColumnMinMax m[N];
  bool clean;

  __device__ void begin(const FusedArgs&, const Scratch&) {
#pragma unroll
    for (int e = 0; e < N; ++e) m[e] = minmax_identity<ColumnMinMax>();
  }
  __device__ GridStridePacks pack_map(const Scratch&, int packs) const {
    return grid_stride_packs(packs);
  }
  __device__ __forceinline__ void add(const Pack<T, N>& p) {
#pragma unroll
    for (int e = 0; e < N; ++e) minmax_add(m[e], to_math(p.v[e]));
  }
  // Exact statistics already; only whether the thread saw a NaN or an infinity.
  template <typename Map, typename Pre>
  __device__ void settle(const Pack<T, N>*, const Map&, Pre) {
    unsigned nonfinite = 0;
#pragma unroll
    for (int e = 0; e < N; ++e) nonfinite |= m[e].nonfinite;
    clean = nonfinite == 0;
  }
  __device__ QPs resolve(const FusedArgs& a, const Scratch& s, int64_t) {
    const int64_t t = global_thread(), threads = global_stride();
    const int64_t row_packs = s.columns / N;
    const int64_t sweeps = threads / row_packs;
    const int64_t first = (t % row_packs) * N;  // this thread's first channel
    // 1. Publish, one 16-byte store per partial, slot e * P + (t % P) within the sweep's row:
    //    a warp's stores are one contiguous stretch. (Field-by-field stores of channel-ordered
    //    slots cost 1.6M L2 sectors, 1.4M of them excess, for f32[2048, 2048] on an H100.)
    const int64_t sweep_row = (t / row_packs) * s.columns + t % row_packs;
#pragma unroll
    for (int e = 0; e < N; ++e) store_partial(&s.partials[sweep_row + e * row_packs], m[e]);
    cg::grid_group grid = cg::this_grid();
    grid.sync();
    // 2. Fold each channel's sweeps.
    const Flags flags = read_flags(a);
    fold_channels(a, flags, s.columns, s.fold_lanes, sweeps, [&](int64_t c, int64_t w) {
      return &s.partials[w * s.columns + (c % N) * row_packs + c / N];
    });
    grid.sync();
    // 3. The qparams of this thread's channels, as the unfused quantizer reads them.
    QPs qps;
#pragma unroll
    for (int e = 0; e < N; ++e)
      qps.qp[e] = qp_of(a.scale_out[first + e], a.zp_out[first + e], flags);
    return qps;
  }
};

// The thread's packs come from Stats::pack_map (see GridStridePacks for what a map must
// guarantee): whole warps share trip counts, so the mask shuffles converge.
template <bool kCodes, typename T, typename Stats, typename Pre>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    fused_cooperative_kernel(const T* x, void* y, uint32_t* mask, int64_t packs,
                             typename Stats::Scratch scratch, int smem_packs, int l2_sweeps,
                             FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* cache = reinterpret_cast<P*>(smem_raw);  // smem_packs packs per thread, thread-interleaved
  const P* xp = reinterpret_cast<const P*>(x);
  const Pre pre;
  Stats stats;
  stats.begin(a, scratch);
  // 32-bit pack indices (the launch requires packs < kMaxPacks, so no index overflows).
  const auto map = stats.pack_map(scratch, static_cast<int>(packs));
  const int first = map.first, step = map.step, end = map.end;
  // 1. Statistics: register packs, then shared-memory packs, then the streamed rest. (Copying
  //    the shared-memory packs with cp.async, all in flight at once, measured slower on an
  //    H100: 24.9 vs 22.6 us for f32[2048, 2048] per tensor; so did the bulk copy engine, one
  //    thread per block issuing each slot's 4 KB run at the start, overlapped with the
  //    register and streamed loads: 22.3 vs 20.6 us, and 146 vs 140 us for f32[8192, 4096].)
  P regs[kCached];
#pragma unroll
  for (int u = 0; u < kCached; ++u) {
    int p = first + u * step;
    if (p < end) {
      regs[u] = pre(load_evict_first(xp + map.at(p)));
      stats.add(regs[u]);
    }
  }
  for (int s0 = 0; s0 < smem_packs; s0 += kUnroll) {
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int p = first + (kCached + s0 + u) * step;
      if (s0 + u < smem_packs && p < end) v[u] = pre(load_evict_first(xp + map.at(p)));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int p = first + (kCached + s0 + u) * step;
      if (s0 + u < smem_packs && p < end) {
        cache[(s0 + u) * blockDim.x + threadIdx.x] = v[u];
        stats.add(v[u]);
      }
    }
  }
  const int streamed_end = first + (kCached + smem_packs) * step;
  // The thread's last l2_sweeps packs stay in L2 at normal priority for the re-read; the
  // streamed ones before them are loaded evict-first, so that they, not those, make room.
  const int sweeps = end > first ? (end - first + step - 1) / step : 0;
  const int kept_from = first + max(0, sweeps - l2_sweeps) * step;
  for (int p0 = streamed_end; p0 < end; p0 += kUnroll * step) {
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = p0 + u * step;
      if (p < end) v[u] = pre(p < kept_from ? load_evict_first(xp + map.at(p)) : xp[map.at(p)]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (p0 + u * step < end) stats.add(v[u]);
  }
  // 2. The grid meets, and every thread gets the qparams of its elements.
  stats.settle(xp, map, pre);
  const typename Stats::QPs qps = stats.resolve(a, scratch, packs);
  const bool fast = stats.clean && qps_fast<kCodes>(qps) && range_fast(a.qmin, a.qmax);
  // 3. Quantize: the streamed packs first, in reverse (the last ones read are the ones still
  //    in L2), then shared memory, then registers; outputs are stored evict-first, so they do
  //    not push the x still to be re-read out of L2. (Registers first, with plain stores,
  //    wrote ~36 MB before the re-read began and evicted most of it.)
  if (streamed_end < end) {
    int last = streamed_end + (end - 1 - streamed_end) / step * step;
    for (int p0 = last; p0 >= streamed_end; p0 -= kUnroll * step) {
      P v[kUnroll];
      int j[kUnroll];  // computed once: a map's at() may cost more than a register
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        j[u] = map.at(p0 - u * step);
        if (p0 - u * step >= streamed_end) v[u] = pre(load_evict_first(xp + j[u]));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 - u * step < streamed_end) break;  // uniform across the warp: whole warps share p0
        uint32_t bits = quantize_pack<kCodes, true>(fast, v[u], y, j[u], qps, a.qmin, a.qmax);
        store_mask_bits<N>(mask, j[u], bits, true);
      }
    }
  }
  for (int sp = 0; sp < smem_packs; ++sp) {
    int p = first + (kCached + sp) * step;
    if (p >= end) break;  // uniform per warp
    const int j = map.at(p);
    uint32_t bits = quantize_pack<kCodes, true>(fast, cache[sp * blockDim.x + threadIdx.x], y, j,
                                                qps, a.qmin, a.qmax);
    store_mask_bits<N>(mask, j, bits, true);
  }
#pragma unroll
  for (int u = 0; u < kCached; ++u) {
    int p = first + u * step;
    bool active = p < end;
    const int j = map.at(p);
    uint32_t bits = 0;
    if (active) bits = quantize_pack<kCodes, true>(fast, regs[u], y, j, qps, a.qmin, a.qmax);
    if (__any_sync(0xffffffffu, active)) store_mask_bits<N>(mask, j, bits, active);
  }
}

// Shared memory per block: the multiprocessor's, split between kBlocksPerSm blocks, less
// room for static shared memory and the runtime. Set on `kernel` once.
template <typename Kernel>
int smem_limit_for(Kernel kernel) {
  int dev = 0, bytes = 0;
  QG_CUDA_CHECK("fused_observe_quantize", cudaGetDevice(&dev));
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  int per_block = bytes / kBlocksPerSm - 2048;
  QG_CUDA_CHECK(
      "fused_observe_quantize",
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, per_block));
  return per_block;
}

// Blocks of a grid whose thread count is a multiple of `row_packs`, so that every thread
// keeps reading the same offset within a row (hence the same channels): as many as the
// resident grid and the work allow, or 0 when one row is longer than the resident grid.
inline int64_t row_multiple_blocks(int64_t resident, int64_t packs, int64_t row_packs) {
  const int64_t step = row_packs / std::gcd(row_packs, int64_t{kThreads});
  const int64_t want = (packs + kThreads - 1) / kThreads;
  const int64_t blocks = std::min(resident, std::max(want, step)) / step * step;
  return blocks < step ? 0 : blocks;
}

// Lanes that fold one channel's partials: up to 32, fewer when every channel needs a group.
inline int fold_lanes(int64_t channels, int64_t threads) {
  int lanes = 1;
  while (lanes < 32 && lanes * 2 * channels <= threads) lanes *= 2;
  return lanes;
}

// The cooperative kernel of one (quantizer, dtype, layout): its function-local statics (the
// shared-memory limit set on it, its occupancy per shared-memory size) are its own.
template <bool kCodes, typename T, typename Stats, typename Pre = NoPrologue>
struct Cooperative {
  static constexpr auto kernel = fused_cooperative_kernel<kCodes, T, Stats, Pre>;

  // Blocks resident per multiprocessor with `smem_bytes` of dynamic shared memory (occupancy
  // depends only on that size here: looked up once per size).
  static int blocks_per_sm(size_t smem_bytes) {
    static std::map<size_t, int> occupancy;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    auto it = occupancy.find(smem_bytes);
    if (it == occupancy.end()) {
      int per_sm = 0;
      QG_CUDA_CHECK("fused_observe_quantize", cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                                  &per_sm, kernel, kThreads, smem_bytes));
      it = occupancy.emplace(smem_bytes, per_sm).first;
    }
    return it->second;
  }

  // The launch of a two-phase kernel over rows of `row_packs` packs with `channels` to fold:
  // the on-chip cache, a grid whose thread count is a multiple of the row, and the fold
  // lanes. False when one row is longer than the resident grid.
  struct RowPlan {
    int smem_packs = 0;
    int64_t blocks = 0, threads = 0;
    int lanes = 1;
  };
  static bool plan_rows(int64_t packs, int64_t row_packs, int64_t channels, RowPlan& p) {
    int64_t resident = 0;
    plan_cache(packs, p.smem_packs, resident);
    p.blocks = row_multiple_blocks(resident, packs, row_packs);
    p.threads = p.blocks * kThreads;
    p.lanes = fold_lanes(channels, p.threads);
    return p.blocks > 0;
  }

  // The on-chip cache of a launch: shared-memory packs per thread (as many as the packs
  // beyond the registers need, within the limit) and the resident blocks with that much.
  static void plan_cache(int64_t packs, int& smem_packs, int64_t& resident) {
    static const int smem_limit = smem_limit_for(kernel);
    const int64_t resident_threads = int64_t{multiprocessor_count()} * kThreads * kBlocksPerSm;
    const int64_t beyond_regs = std::max<int64_t>(0, packs - resident_threads * kCached);
    smem_packs = static_cast<int>(std::min<int64_t>(
        smem_limit / (16 * kThreads), (beyond_regs + resident_threads - 1) / resident_threads));
    resident = int64_t{blocks_per_sm(size_t(smem_packs) * 16 * kThreads)} * multiprocessor_count();
  }
};

// Grid sweeps of 16-byte packs that fill half the L2: about what the quantize phase's re-read
// measured to hit (24.5 MB of a 50 MB L2 on an H200), the rest of the L2 going to the outputs
// and the other partition's copies. Loading the earlier sweeps evict-first saves 3% for f32
// (H200, per tensor f32[8192, 4096]: 100.2-100.7 us against 102.9 us); bf16 is unchanged.
inline int l2_kept_sweeps(unsigned grid) {
  const int64_t keep = l2_cache_bytes() / 2, sweep = int64_t{grid} * kThreads * 16;
  return static_cast<int>((keep + sweep - 1) / sweep);
}

template <typename Kernel, typename Scratch, typename T>
void launch_cooperative(Kernel kernel, unsigned grid, int smem_packs, const T* x,
                        KernelContext& ctx, int64_t packs, Scratch scratch, const FusedArgs& a) {
  void* y = ctx.outputs[0].raw_data();
  uint32_t* mask = out_ptr<uint32_t>(ctx.outputs[1]);
  FusedArgs args = a;
  int l2_sweeps = l2_kept_sweeps(grid);
  void* params[] = {&x, &y, &mask, &packs, &scratch, &smem_packs, &l2_sweeps, &args};
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaLaunchCooperativeKernel(
                    reinterpret_cast<void*>(kernel), dim3(grid), dim3(kThreads), params,
                    size_t(smem_packs) * 16 * kThreads, cuda_stream(ctx.device)));
  QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
}

inline Tensor scratch_bytes(KernelContext& ctx, int64_t bytes) {
  return Tensor::empty({bytes}, DType::u8, ctx.inputs[0].device());
}

// Per tensor: the cooperative kernel over all of x, applying `Pre` to each pack it loads.
// False when x does not split into whole warps of packs.
template <bool kCodes, typename T, typename Pre>
bool launch_tensor(KernelContext& ctx, const FusedArgs& a) {
  const Tensor& x = ctx.inputs[0];
  constexpr int N = kVec<T>;
  const int64_t n = x.numel();
  if (n == 0 || n % (32 * N) != 0 || n / N >= kMaxPacks) return false;
  const int64_t packs = n / N;
  using Coop = Cooperative<kCodes, T, TensorStats<T>, Pre>;
  int smem_packs = 0;
  int64_t resident = 0;
  Coop::plan_cache(packs, smem_packs, resident);
  const int64_t want = (packs + kThreads - 1) / kThreads;
  auto grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, want)));
  Tensor partials = scratch_bytes(ctx, grid * int64_t{sizeof(MinMax)});
  launch_cooperative(Coop::kernel, grid, smem_packs, in_ptr<T>(x), ctx, packs,
                     typename TensorStats<T>::Scratch{out_ptr<MinMax>(partials)}, a);
  return true;
}

}  // namespace qg::cuda::fused::coop
