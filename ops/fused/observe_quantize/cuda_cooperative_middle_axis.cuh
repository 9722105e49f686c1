// The cooperative fused observer + quantizer (cuda_cooperative.cuh) per channel on a middle
// axis of [outer, C, inner] (e.g. axis 1 of NCHW activations), with inner a multiple of N:
// every pack lies in one channel, channel c's packs are runs of channel_packs = inner / N
// consecutive packs, one per outer index, and a row of the outer axis is C * channel_packs
// packs. Two ways to give each thread packs of one channel:
//  * the row map (MiddleStats): a grid whose thread count is a multiple of the row. It needs
//    no index arithmetic, but leaves idle whatever part of the resident grid is not a whole
//    number of rows (f32[128, 64, 64, 64]: 256 of 396 blocks on a 132-multiprocessor GPU);
//  * the channel-major map (ChannelMajorStats): the same number of threads for every channel,
//    as many as the resident grid allows, each walking its channel's packs.
#pragma once

#include <algorithm>

#include "ops/fused/observe_quantize/cuda_cooperative.cuh"

namespace qg::cuda::fused::coop {

// The statistics of a thread whose packs all lie in one channel: raw-bit ones while its
// elements are finite, redone exactly by settle() otherwise (as TensorStats), the re-read
// walking the thread's own pack sequence (`map`).
template <typename T>
struct OneChannelStats {
  static constexpr int N = kVec<T>;
  RawMinMax raw;
  ColumnMinMax m;
  bool clean;

  __device__ __forceinline__ void add(const Pack<T, N>& p) { raw_add(raw, p); }
  template <typename Map, typename Pre>
  __device__ void settle(const Pack<T, N>* xp, const Map& map, Pre pre) {
    clean = raw_clean<T>(raw);
    if (clean) {
      const MinMax r = raw_minmax<T>(raw);
      m = {r.mn, r.mx, r.zeros, 0u};
      return;
    }
    m = minmax_identity<ColumnMinMax>();
    for (int p = map.first; p < map.end; p += map.step) exact_add(m, pre(xp[map.at(p)]));
  }
};

// Per channel on a middle axis, row map: the grid stride is a multiple of the row
// (row_packs = C * channel_packs), so thread t always reads packs of channel
// (t % row_packs) / channel_packs. Aligned groups of `group_lanes` lanes
// (a power of two dividing inner / N) read the same channel, so each group combines its
// statistics by shuffles and publishes one partial; a grid barrier; groups of lanes fold
// each channel's partials and write its state and qparams; a second barrier; and every
// thread reads the qparams of its one channel. (Publishing one partial per thread left
// 1536 partials per channel for f32[32, 64, 32, 32], folded by 32 lanes one dependent L2
// load after another: 29 us on an H100, three times the copy.)
template <typename T>
struct MiddleStats : OneChannelStats<T> {
  using OneChannelStats<T>::m;
  using OneChannelStats<T>::raw;
  using QPs = UniformQP;
  struct Scratch {
    ColumnMinMax* partials;  // one per lane group of the grid, in thread order
    int64_t channels;        // C
    int64_t channel_packs;   // inner / N: consecutive packs of one channel within a row
    int group_lanes;         // lanes that share a channel and publish one partial
    int fold_lanes;          // lanes that fold one channel (a power of two <= 32)
  };

  __device__ void begin(const FusedArgs&, const Scratch&) { raw = raw_identity<T>(); }
  __device__ GridStridePacks pack_map(const Scratch&, int packs) const {
    return grid_stride_packs(packs);
  }
  __device__ QPs resolve(const FusedArgs& a, const Scratch& s, int64_t) {
    const int64_t t = global_thread(), threads = global_stride();
    const int64_t row_packs = s.channels * s.channel_packs;
    const int group = s.group_lanes;
    const MinMax mine = lanes_reduce(MinMax{m.mn, m.mx, m.zeros, m.nonfinite}, group);
    if (t % group == 0)
      store_partial(&s.partials[t / group],
                    {mine.mn, mine.mx, mine.zeros, static_cast<unsigned>(mine.nonfinite)});
    cg::grid_group grid = cg::this_grid();
    grid.sync();
    // Channel c's partials: sweep w's groups (w * row_packs + c * channel_packs) / group
    // + [0, channel_packs / group).
    const Flags flags = read_flags(a);
    const int64_t run = s.channel_packs / group, per_channel = threads / row_packs * run;
    fold_channels(a, flags, s.channels, s.fold_lanes, per_channel, [&](int64_t c, int64_t i) {
      return &s.partials[(i / run * row_packs + c * s.channel_packs) / group + i % run];
    });
    grid.sync();
    const int64_t channel = (t % row_packs) / s.channel_packs;
    return {qp_of(a.scale_out[channel], a.zp_out[channel], flags)};
  }
};

// n / d for n < 2^31 and d in [2, 2^31), as a multiply-high and a shift: with l = ceil(log2 d)
// and m = ceil(2^(31 + l) / d), n / d = floor(m * n / 2^(31 + l)) = umulhi(m, n) >> (l - 1).
// Exact: m * d = 2^(31 + l) + e with 0 <= e < d, so m * n / 2^(31 + l) exceeds n / d by
// n * e / (d * 2^(31 + l)) < 1 / d, less than the gap from n / d to the next integer. And m fits
// 32 bits: 2^(l - 1) < d gives 2^(31 + l) / d <= 2^32 - 2 unless d = 2^l (then m = 2^31).
// (FastDivmod, for any d >= 1, needs an add as well.)
struct RunDivisor {
  uint32_t multiplier = 0, shift = 0;
  RunDivisor() = default;
  explicit RunDivisor(uint32_t d) {
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return __umulhi(multiplier, n) >> shift;
  }
};

// Channel-major map: thread t works for channel c = t / T_c (T_c threads per channel, a
// multiple of 32) as its thread t_c = t % T_c. The channel's packs are numbered over (outer
// o, position i within the run): p = o * channel_packs + i, at index j = (o * C + c) *
// channel_packs + i of x, and the thread reads p = t_c + k * T_c. With channel_packs % 32 == 0
// (the launch requires it) a warp's 32 lanes read 32 consecutive packs of one run, p and j
// both starting at a multiple of 32: coalesced loads, whole mask words, and (outer *
// channel_packs being a multiple of 32) the same trip count for every lane. Threads past
// C * T_c have no packs (end = 0).
struct ChannelMajorPacks {
  int first, step, end;  // t_c, T_c, outer * channel_packs
  int base;              // c * channel_packs: the run of outer index 0
  int skip;              // (C - 1) * channel_packs: the other channels' runs of one row
  RunDivisor run;        // divides by channel_packs
  // j = o * C * channel_packs + c * channel_packs + i = base + p + o * skip, with o = p /
  // channel_packs (p < 2^31). Unsigned arithmetic: the kernel also asks for the index of
  // packs it then skips (p past either end), whose value is never used but must not overflow
  // a signed int.
  __device__ __forceinline__ int at(int p) const {
    const uint32_t u = static_cast<uint32_t>(p);
    return static_cast<int>(static_cast<uint32_t>(base) + u +
                            run.div(u) * static_cast<uint32_t>(skip));
  }
};

// Per channel on a middle axis with the channel-major map. Each warp (one channel) combines
// its statistics by shuffles and publishes one partial; a grid barrier; then each block folds
// the partials of the channels its own threads work for (at most one per warp, as a warp
// never straddles two channels), one warp per channel, and the block holding a channel's
// first thread writes its state and qparams. Every block folds a channel's partials in the
// same order from the same state, read before the barrier, so all agree without the second
// barrier that a fold-then-read scheme needs (A/B on an H200: see launch_fused_middle). The
// raw-bit statistics and settle() are OneChannelStats'.
template <typename T>
struct ChannelMajorStats : OneChannelStats<T> {
  using OneChannelStats<T>::m;
  using OneChannelStats<T>::raw;
  using QPs = UniformQP;
  struct Scratch {
    ColumnMinMax* partials;  // [C][T_c / 32]: one per warp, in thread order
    int channels;            // C
    int channel_threads;     // T_c, a multiple of 32
    int channel_packs;       // inner / N, a multiple of 32
    int channel_total;       // outer * channel_packs: the packs of one channel
    RunDivisor run;          // divides by channel_packs
  };
  int channel;  // c; C or more for the threads past C * T_c
  bool folds;   // the warp is its channel's first in this block: it folds the channel
  Running old;  // the folded channel's state before this launch (folding warps only)

  __device__ void begin(const FusedArgs& a, const Scratch& s) {
    raw = raw_identity<T>();
    const int t = static_cast<int>(global_thread());
    channel = t / s.channel_threads;  // once per thread: a plain division
    const int warp_first = t - static_cast<int>(threadIdx.x % 32);
    folds = channel < s.channels &&
            (threadIdx.x < 32 || (warp_first - 32) / s.channel_threads != channel);
    if (folds) old = read_state(a, channel);
  }
  __device__ ChannelMajorPacks pack_map(const Scratch& s, int) const {
    const int t = static_cast<int>(global_thread());
    const bool works = channel < s.channels;
    return {t - channel * s.channel_threads,    s.channel_threads,
            works ? s.channel_total : 0,        channel * s.channel_packs,
            (s.channels - 1) * s.channel_packs, s.run};
  }
  __device__ QPs resolve(const FusedArgs& a, const Scratch& s, int64_t) {
    const int t = static_cast<int>(global_thread()), lane = static_cast<int>(threadIdx.x % 32);
    // Every lane of a warp has the same channel (T_c is a multiple of 32).
    const MinMax mine = lanes_reduce(MinMax{m.mn, m.mx, m.zeros, m.nonfinite}, 32);
    if (channel < s.channels && lane == 0)
      store_partial(&s.partials[t / 32],
                    {mine.mn, mine.mx, mine.zeros, static_cast<unsigned>(mine.nonfinite)});
    cg::this_grid().sync();
    // Channel c's partials: its warps c * T_c / 32 + [0, T_c / 32).
    __shared__ QP channel_qp[kThreads / 32];  // by the folding warp's index in the block
    const int block_first = t - static_cast<int>(threadIdx.x);
    if (folds) {  // uniform per warp
      const int warps = s.channel_threads / 32;
      MinMax acc = minmax_identity();
      for (int i = lane; i < warps; i += 32)
        acc = combine(acc, load_partial(&s.partials[channel * warps + i]));
      acc = lanes_reduce(acc, 32);
      const bool writes = lane == 0 && channel * s.channel_threads >= block_first;
      const QP qp = update_and_qparams(a, read_flags(a), channel, old, finish(acc), true, writes);
      if (lane == 0) channel_qp[threadIdx.x / 32] = qp;
    }
    __syncthreads();
    // The folding warp of this thread's channel; the threads past C * T_c quantize nothing,
    // and warp 0 (which always works: the grid ends within the last channel's block) serves.
    const int channel_first = channel * s.channel_threads;
    const int slot = channel < s.channels && channel_first > block_first
                         ? (channel_first - block_first) / 32
                         : 0;
    return {channel_qp[slot]};
  }
};

// The launch of the channel-major map on the cooperative kernel `Coop`: the on-chip cache,
// T_c = the resident threads per channel rounded down to a multiple of 32 (at most a
// channel's packs, which are a multiple of 32) and the blocks of C * T_c threads. False when a
// channel's run is not a multiple of 32 packs or the resident grid has fewer than 32 threads per
// channel.
struct ChannelPlan {
  int smem_packs = 0;
  int64_t blocks = 0, channel_threads = 0;
};
template <typename Coop>
bool plan_channel_major(int64_t packs, int64_t channels, int64_t channel_packs, ChannelPlan& p) {
  if (channel_packs % 32 != 0) return false;
  int64_t resident = 0;
  Coop::plan_cache(packs, p.smem_packs, resident);
  const int64_t channel_total = packs / channels;
  p.channel_threads = std::min(resident * kThreads / channels / 32 * 32, channel_total);
  if (p.channel_threads < 32) return false;
  p.blocks = (channels * p.channel_threads + kThreads - 1) / kThreads;
  return true;
}

}  // namespace qg::cuda::fused::coop
