// Single-kernel CUDA paths for fused observer + fake_quantize (or + quantize, writing s8/u8
// codes), bit-identical to the unfused graph (the same qmath/qstore/obsmath element
// functions, the same tie rules) and free of host synchronisation (statistics, flags and
// qparams stay on the device).
//
//  * Rows (per-channel with the channel as the outermost axis, per token, per group along
//    the innermost axis): one block per row, or one warp per row for rows of up to 128
//    packs. The row is loaded once into registers, reduced, every thread computes the
//    qparams (one thread also updates the state), and the row is quantized from registers.
//  * Per tensor, delayed mode (qparams of the state before this batch): every block
//    quantizes its contiguous run while reducing it, and the last block to finish folds the
//    statistics into the state: one pass over x whatever its size.
//  * Per tensor: a cooperative (persistent) grid. Each thread keeps up to kCached 16-byte
//    packs in registers; the rest is streamed. Blocks publish partial (min, max) pairs, meet
//    at a grid barrier, each folds the partials in the same order, and quantizes: the cached
//    packs from registers, the streamed ones re-read in reverse order so the most recently
//    read bytes are still in L2. A tensor that fits in the grid's registers is read once.
//
// Min and max follow the CPU observers' order-independent rule for signed zeros
// (obsmath::ordered_min/ordered_max), so the reduction order does not matter. Other cases (f64,
// non-leading channel axes, lengths that break 32-bit mask words) run the two original kernels.
#include <cooperative_groups.h>
#include <climits>
#include <map>
#include <mutex>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/fused/fused_observe_quantize.h"
#include "ops/observer/observer_math.h"
#include "ops/quantize/quantize_math.h"

namespace qg {
namespace {

using namespace cuda;
namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kRowPacks = 4;  // packs per thread a row may need (rows up to 1024 packs)
constexpr int kCached = 4;    // packs per thread held in registers on the per-tensor path
constexpr int kUnroll = 4;    // streamed packs in flight per thread

// Batch statistics with the CPU observers' rule for signed zeros (obsmath::ordered_min /
// ordered_max: -0 wins the min, +0 the max), which makes them independent of the reduction
// order. The hot loop uses plain fminf/fmaxf and only records which zero signs it saw; the
// sign of a zero extreme is settled once at the end (finish()).
struct MinMax {
  float mn, mx;
  unsigned zeros;  // bit 0: saw -0, bit 1: saw +0
  unsigned long long nonfinite;
};

__device__ __forceinline__ MinMax minmax_identity() {
  return {INFINITY, -INFINITY, 0u, 0ull};
}

__device__ __forceinline__ void minmax_add(MinMax& m, float v, long long) {
  bool finite = fabsf(v) < INFINITY;  // false for NaN and +/-Inf
  m.nonfinite += finite ? 0u : 1u;
  m.mn = finite ? fminf(m.mn, v) : m.mn;
  m.mx = finite ? fmaxf(m.mx, v) : m.mx;
  unsigned bits = __float_as_uint(v);
  unsigned zero = (bits << 1) == 0u;
  m.zeros |= zero << (1u - (bits >> 31));  // -0 -> bit 0, +0 -> bit 1
}

__device__ __forceinline__ MinMax combine(MinMax a, const MinMax& b) {
  a.mn = fminf(a.mn, b.mn);
  a.mx = fmaxf(a.mx, b.mx);
  a.zeros |= b.zeros;
  a.nonfinite += b.nonfinite;
  return a;
}

__device__ __forceinline__ MinMax finish(MinMax m) {
  if (m.mn == 0.0f) m.mn = (m.zeros & 1u) ? -0.0f : 0.0f;
  if (m.mx == 0.0f) m.mx = (m.zeros & 2u) ? 0.0f : -0.0f;
  return m;
}

__device__ __forceinline__ MinMax warp_reduce(MinMax m) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    MinMax o;
    o.mn = __shfl_xor_sync(0xffffffffu, m.mn, off);
    o.mx = __shfl_xor_sync(0xffffffffu, m.mx, off);
    o.zeros = __shfl_xor_sync(0xffffffffu, m.zeros, off);
    o.nonfinite = __shfl_xor_sync(0xffffffffu, m.nonfinite, off);
    m = combine(m, o);
  }
  return m;
}

// Block-wide combine (the operation is order-independent); every thread gets the result.
__device__ MinMax block_minmax(MinMax m) {
  __shared__ MinMax warps[32];
  __shared__ MinMax result;
  m = warp_reduce(m);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    int nwarps = (blockDim.x + 31) >> 5;
    MinMax w = lane < nwarps ? warps[lane] : minmax_identity();
    w = warp_reduce(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  MinMax r = result;
  __syncthreads();
  return r;
}

// Everything the fused kernels need besides x, y and the mask.
struct FusedArgs {
  bool moving_average;
  bool delayed;  // quantize with the qparams of the state before this batch
  float averaging_constant;
  bool training;
  qmath::QParamsConfig cfg;
  float qmin, qmax;  // the quantizer's range
  float* st_min;
  float* st_max;
  uint8_t* st_init;  // moving average only
  unsigned long long* nonfinite;
  const uint8_t* observer_enabled;
  const uint8_t* fake_quant_enabled;  // null when the quantizer has no flag
  float* scale_out;
  int32_t* zp_out;
};

struct QP {
  float scale, inv, zp;
  bool on;  // fake_quant_enabled
};

// The observer update for channel q from this batch's (min, max), then the qparams; the
// same decisions as the CPU kernels. `write` is false for blocks that only need the result.
struct Running {
  float mn, mx;
  bool init;
};

__device__ __forceinline__ Running read_state(const FusedArgs& a, int64_t q) {
  return {a.st_min[q], a.st_max[q], a.st_init != nullptr && a.st_init[q] != 0};
}

// The two device flags, read once per launch (nothing changes them while a kernel runs).
struct Flags {
  bool observe, quantize;
};

__device__ __forceinline__ Flags read_flags(const FusedArgs& a) {
  return {*a.observer_enabled != 0, a.fake_quant_enabled == nullptr || *a.fake_quant_enabled != 0};
}

// `old` is the state as it was before this launch (read before any block could write it).
__device__ QP update_and_qparams(const FusedArgs& a, const Flags& f, int64_t q, const Running& old,
                                 const MinMax& b, bool nonempty, bool write) {
  float mn = old.mn, mx = old.mx;
  const bool old_valid = a.moving_average ? old.init : old.mn <= old.mx;
  const qmath::QParams before = qmath::qparams_from_range(old.mn, old.mx, old_valid, a.cfg);
  bool update = a.training && f.observe && nonempty;
  bool valid;
  if (a.moving_average) {
    bool init = old.init;
    if (update && b.mn <= b.mx) {
      if (init) {
        mn = obsmath::moving_average(mn, b.mn, a.averaging_constant);
        mx = obsmath::moving_average(mx, b.mx, a.averaging_constant);
      } else {
        mn = b.mn;
        mx = b.mx;
      }
      init = true;
    }
    valid = init;
    if (write) a.st_init[q] = init ? 1 : 0;
  } else {
    if (update) {
      mn = obsmath::ordered_min(mn, b.mn);
      mx = obsmath::ordered_max(mx, b.mx);
    }
    valid = mn <= mx;
  }
  const qmath::QParams p = a.delayed ? before : qmath::qparams_from_range(mn, mx, valid, a.cfg);
  if (write) {
    a.st_min[q] = mn;
    a.st_max[q] = mx;
    a.scale_out[q] = p.scale;
    a.zp_out[q] = p.zero_point;
    if (update && b.nonfinite) atomicAdd(a.nonfinite, b.nonfinite);
  }
  return {p.scale, 1.0f / p.scale, static_cast<float>(p.zero_point), f.quantize};
}

// Fake-quantizes one pack and returns its in-range bits (bit e for element e).
template <typename T, int N>
__device__ __forceinline__ uint32_t quantize_pack(const Pack<T, N>& in, Pack<T, N>& out,
                                                  const QP& qp, float qmin, float qmax) {
  uint32_t bits = 0;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float v = to_math(in.v[e]);
    if (qp.on) {
      auto r = qmath::fake_quant<float>(v, qp.inv, qp.scale, qp.zp, qmin, qmax);
      out.v[e] = from_math<T>(r.y);
      bits |= static_cast<uint32_t>(r.in_range) << e;
    } else {
      out.v[e] = in.v[e];
      bits |= 1u << e;
    }
  }
  return bits;
}

// N storage codes of one pack (the quantize quantizer's output), stored as one N-byte word.
template <int N>
struct alignas(N) Codes {
  uint8_t v[N];
};

// Quantizes pack `in` (element index j * N) and stores it at y[j]: fake-quantized values of
// type T, or (kCodes) s8/u8 codes with qstore::quantize's rules. Returns the in-range bits.
template <bool kCodes, typename T, int N>
__device__ __forceinline__ uint32_t quantize_store(const Pack<T, N>& in, void* y, int64_t j,
                                                   const QP& qp, float qmin, float qmax) {
  if constexpr (kCodes) {
    Codes<N> out;
    uint32_t bits = 0;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      qstore::Code c = qstore::quantize<float>(to_math(in.v[e]), qp.inv, qp.zp, qmin, qmax);
      out.v[e] = static_cast<uint8_t>(c.q);  // the low byte: s8 and u8 storage alike
      bits |= static_cast<uint32_t>(c.in_range) << e;
    }
    static_cast<Codes<N>*>(y)[j] = out;
    return bits;
  } else {
    Pack<T, N> out;
    uint32_t bits = quantize_pack(in, out, qp, qmin, qmax);
    static_cast<Pack<T, N>*>(y)[j] = out;
    return bits;
  }
}

// Gathers the N-bit groups of the 32 / N consecutive lanes that share a 32-bit mask word;
// the first lane of each group stores it. Every lane of the warp must call this.
template <int N>
__device__ __forceinline__ void store_mask_bits(uint32_t* words, int64_t pack, uint32_t bits,
                                                bool active) {
  constexpr int kLanesPerWord = 32 / N;
  int lane = threadIdx.x & 31;
  uint32_t word = active ? bits << ((lane % kLanesPerWord) * N) : 0u;
#pragma unroll
  for (int off = 1; off < kLanesPerWord; off <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, off);
  if (active && lane % kLanesPerWord == 0) words[pack * N / 32] = word;
}

template <typename T, int N>
__device__ __forceinline__ void load_row(const Pack<T, N>* xr, int64_t packs,
                                         Pack<T, N> (&r)[kRowPacks]) {
#pragma unroll
  for (int u = 0; u < kRowPacks; ++u) {
    int64_t j = threadIdx.x + int64_t{u} * kThreads;
    if (j < packs) r[u] = xr[j];
  }
}

// One block per row; the next row's loads (and its state) are issued before the current row
// is reduced and quantized, so memory stays busy through the block's reduction. Every thread
// computes the qparams itself from the block's statistics and the prefetched state, so no
// thread waits on a global read or a second barrier; thread 0 alone writes the state.
template <bool kCodes, typename T>
__global__ void __launch_bounds__(kThreads, 3)
    fused_rows_kernel(const T* x, void* y, uint32_t* mask, int64_t rows, int64_t packs_per_row,
                      FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  const P* xp = reinterpret_cast<const P*>(x);
  const Flags flags = read_flags(a);
  // Each block walks one contiguous run of rows: DRAM pages stay open between rows (a
  // grid-strided walk measured about 20% slower on an H200 for plain streaming).
  const int64_t per_block = (rows + gridDim.x - 1) / gridDim.x;
  const int64_t first = blockIdx.x * per_block;
  const int64_t end = first + per_block < rows ? first + per_block : rows;
  P cur[kRowPacks];
  Running state{};
  if (first < end) {
    load_row<T, N>(xp + first * packs_per_row, packs_per_row, cur);
    state = read_state(a, first);
  }
  for (int64_t row = first; row < end; ++row) {
    P next[kRowPacks];
    Running next_state{};
    int64_t next_row = row + 1;
    if (next_row < end) {
      load_row<T, N>(xp + next_row * packs_per_row, packs_per_row, next);
      next_state = read_state(a, next_row);
    }
    MinMax m = minmax_identity();
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) {
      int64_t j = threadIdx.x + int64_t{u} * kThreads;
      if (j < packs_per_row)
#pragma unroll
        for (int e = 0; e < N; ++e) minmax_add(m, to_math(cur[u].v[e]), j * N + e);
    }
    MinMax b = finish(block_minmax(m));
    QP qp = update_and_qparams(a, flags, row, state, b, packs_per_row > 0, threadIdx.x == 0);
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) {
      int64_t j = threadIdx.x + int64_t{u} * kThreads;
      bool active = j < packs_per_row;
      uint32_t bits = 0;
      if (active)
        bits = quantize_store<kCodes>(cur[u], y, row * packs_per_row + j, qp, a.qmin, a.qmax);
      if (__any_sync(0xffffffffu, active))
        store_mask_bits<N>(mask, row * packs_per_row + j, bits, active);
    }
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) cur[u] = next[u];
    state = next_state;
  }
}

// Short rows (per-group qparams, short tokens or channels: up to 32 * kRowPacks packs): one
// warp per row, reduced with shuffles, so a block works on eight rows at once and never
// waits at a barrier. Lane 0 writes the state.
template <bool kCodes, typename T>
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
    P cur[kRowPacks];
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) {
      int64_t j = lane + int64_t{u} * 32;
      if (j < packs_per_row) cur[u] = xp[row * packs_per_row + j];
    }
    const Running state = read_state(a, row);
    MinMax m = minmax_identity();
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) {
      int64_t j = lane + int64_t{u} * 32;
      if (j < packs_per_row)
#pragma unroll
        for (int e = 0; e < N; ++e) minmax_add(m, to_math(cur[u].v[e]), j * N + e);
    }
    MinMax b = finish(warp_reduce(m));
    QP qp = update_and_qparams(a, flags, row, state, b, packs_per_row > 0, lane == 0);
#pragma unroll
    for (int u = 0; u < kRowPacks; ++u) {
      int64_t j = lane + int64_t{u} * 32;
      bool active = j < packs_per_row;
      uint32_t bits = 0;
      if (active)
        bits = quantize_store<kCodes>(cur[u], y, row * packs_per_row + j, qp, a.qmin, a.qmax);
      if (__any_sync(0xffffffffu, active))
        store_mask_bits<N>(mask, row * packs_per_row + j, bits, active);
    }
  }
}

template <bool kCodes, typename T>
__global__ void __launch_bounds__(kThreads, 3)
    fused_tensor_kernel(const T* x, void* y, uint32_t* mask, int64_t packs, MinMax* partials,
                        int smem_packs, FusedArgs a) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* cache = reinterpret_cast<P*>(smem_raw);  // smem_packs packs per thread, thread-interleaved
  const P* xp = reinterpret_cast<const P*>(x);
  const int64_t tid = global_thread(), stride = global_stride();
  // Every block needs the pre-launch state, and block 0 overwrites it after the barrier.
  const Running old = read_state(a, 0);
  // 1. Reduce: cached packs first, then the streamed rest, in ascending index order.
  P regs[kCached];
  MinMax m = minmax_identity();
#pragma unroll
  for (int u = 0; u < kCached; ++u) {
    int64_t j = tid + u * stride;
    if (j < packs) {
      regs[u] = xp[j];
#pragma unroll
      for (int e = 0; e < N; ++e)
        minmax_add(m, to_math(regs[u].v[e]), static_cast<long long>(j * N + e));
    }
  }
  // Then up to smem_packs more per thread in shared memory (loaded kUnroll at a time).
  for (int s0 = 0; s0 < smem_packs; s0 += kUnroll) {
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t j = tid + (kCached + s0 + u) * stride;
      if (s0 + u < smem_packs && j < packs) v[u] = xp[j];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t j = tid + (kCached + s0 + u) * stride;
      if (s0 + u < smem_packs && j < packs) {
        cache[(s0 + u) * blockDim.x + threadIdx.x] = v[u];
#pragma unroll
        for (int e = 0; e < N; ++e) minmax_add(m, to_math(v[u].v[e]), j * N + e);
      }
    }
  }
  int64_t streamed_end = tid + (kCached + int64_t{smem_packs}) * stride;
  // Four independent loads in flight per thread before any is used.
  for (int64_t j0 = streamed_end; j0 < packs; j0 += kUnroll * stride) {
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j0 + u * stride < packs) v[u] = xp[j0 + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j0 + u * stride < packs)
#pragma unroll
        for (int e = 0; e < N; ++e) minmax_add(m, to_math(v[u].v[e]), (j0 + u * stride) * N + e);
  }
  MinMax bm = block_minmax(m);
  if (threadIdx.x == 0) partials[blockIdx.x] = bm;
  // 2. Every block folds all partials the same way, so all agree without a second barrier;
  //    only block 0 writes the state and the qparams.
  cg::this_grid().sync();
  MinMax all = minmax_identity();
  for (int64_t p = threadIdx.x; p < gridDim.x; p += blockDim.x) all = combine(all, partials[p]);
  all = finish(block_minmax(all));
  QP qp = update_and_qparams(a, read_flags(a), 0, old, all, packs > 0,
                             blockIdx.x == 0 && threadIdx.x == 0);
  // 3. Quantize: registers first, then the streamed packs in reverse (L2-warm first).
#pragma unroll
  for (int u = 0; u < kCached; ++u) {
    int64_t j = tid + u * stride;
    bool active = j < packs;
    uint32_t bits = 0;
    if (active) bits = quantize_store<kCodes>(regs[u], y, j, qp, a.qmin, a.qmax);
    if (__any_sync(0xffffffffu, active)) store_mask_bits<N>(mask, j, bits, active);
  }
  // Packs come in whole warps (the fast path needs packs % 32 == 0 and stride is a multiple
  // of 32), so every lane of a warp has the same trip count and the mask shuffle converges.
  for (int sp = 0; sp < smem_packs; ++sp) {
    int64_t j = tid + (kCached + sp) * stride;
    if (j >= packs) break;  // uniform per warp
    uint32_t bits =
        quantize_store<kCodes>(cache[sp * blockDim.x + threadIdx.x], y, j, qp, a.qmin, a.qmax);
    store_mask_bits<N>(mask, j, bits, true);
  }
  if (streamed_end < packs) {
    int64_t last = streamed_end + (packs - 1 - streamed_end) / stride * stride;
    for (int64_t j0 = last; j0 >= streamed_end; j0 -= kUnroll * stride) {
      P v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (j0 - u * stride >= streamed_end) v[u] = xp[j0 - u * stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t j = j0 - u * stride;
        if (j < streamed_end) break;  // uniform across the warp: whole warps share j0
        uint32_t bits = quantize_store<kCodes>(v[u], y, j, qp, a.qmin, a.qmax);
        store_mask_bits<N>(mask, j, bits, true);
      }
    }
  }
}

// Delayed mode, per tensor: the qparams come from the state before this batch, so every
// block quantizes its own contiguous run of packs while reducing it, in one pass over x. The
// last block to finish (a ticket counter) folds the partials and updates the state.
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
  const QP qp = update_and_qparams(a, flags, 0, old, minmax_identity(), false, false);
  const int64_t first = blockIdx.x * packs_per_block;
  const int64_t end = first + packs_per_block < packs ? first + packs_per_block : packs;
  MinMax m = minmax_identity();
  // packs_per_block and packs are multiples of 32, so `j < end` is uniform per warp.
  for (int64_t j0 = first + threadIdx.x; j0 < end; j0 += kUnroll * kThreads) {
    P v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j0 + u * kThreads < end) v[u] = xp[j0 + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t j = j0 + u * kThreads;
      if (j >= end) break;
#pragma unroll
      for (int e = 0; e < N; ++e) minmax_add(m, to_math(v[u].v[e]), j * N + e);
      uint32_t bits = quantize_store<kCodes>(v[u], y, j, qp, a.qmin, a.qmax);
      store_mask_bits<N>(mask, j, bits, true);
    }
  }
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
  all = finish(block_minmax(all));
  if (threadIdx.x == 0) {
    update_and_qparams(a, flags, 0, old, all, packs > 0, true);
    *ticket = 0;
  }
}

// Reads the node's attributes and state tensors into the kernel arguments.
FusedArgs make_args(KernelContext& ctx) {
  const Node& obs = ctx.node.fused_from.at(0);
  const Node& q = ctx.node.fused_from.at(1);
  FusedArgs a{};
  a.moving_average = obs.op->name == "moving_average_observer";
  a.averaging_constant =
      a.moving_average ? static_cast<float>(obs.attrs.get_real("averaging_constant")) : 0.f;
  a.training = ctx.training;
  a.delayed = obs.attrs.has("delayed") && obs.attrs.get_bool("delayed");
  a.cfg = qparams_config_from_attrs(obs.op->name, obs.attrs);
  QuantRange r = quant_range_from_attrs(q.op->name, q.attrs);
  a.qmin = static_cast<float>(r.qmin);
  a.qmax = static_cast<float>(r.qmax);
  size_t s = 0;
  a.st_min = out_ptr<float>(ctx.states.at(s++));
  a.st_max = out_ptr<float>(ctx.states.at(s++));
  a.st_init = a.moving_average ? out_ptr<uint8_t>(ctx.states.at(s++)) : nullptr;
  a.nonfinite = out_ptr<unsigned long long>(ctx.states.at(s++));
  a.observer_enabled = out_ptr<uint8_t>(ctx.states.at(s++));
  a.fake_quant_enabled = s < ctx.states.size() ? out_ptr<uint8_t>(ctx.states.at(s)) : nullptr;
  a.scale_out = out_ptr<float>(ctx.outputs[2]);
  a.zp_out = out_ptr<int32_t>(ctx.outputs[3]);
  return a;
}

template <bool kCodes, typename T>
void launch_tensor(KernelContext& ctx, const FusedArgs& a, int64_t packs, cudaStream_t stream) {
  auto kernel = fused_tensor_kernel<kCodes, T>;
  // Three blocks per multiprocessor (24 warps) keep enough loads in flight; the shared
  // memory of the multiprocessor is split between them and extends the on-chip cache by as
  // many 16-byte packs per thread as fit (no more than the tensor needs). Set up once.
  constexpr int kBlocksPerSm = 3;
  static int smem_limit = [&] {
    int dev = 0, bytes = 0;
    QG_CUDA_CHECK("fused_observe_quantize", cudaGetDevice(&dev));
    QG_CUDA_CHECK("fused_observe_quantize",
                  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    int per_block = bytes / kBlocksPerSm - 2048;  // room for static shared memory and the runtime
    QG_CUDA_CHECK(
        "fused_observe_quantize",
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, per_block));
    return per_block;
  }();
  int64_t resident_threads = int64_t{multiprocessor_count()} * kThreads * kBlocksPerSm;
  int64_t beyond_regs = std::max<int64_t>(0, packs - resident_threads * kCached);
  int smem_packs = static_cast<int>(std::min<int64_t>(
      smem_limit / (16 * kThreads), (beyond_regs + resident_threads - 1) / resident_threads));
  size_t smem_bytes = static_cast<size_t>(smem_packs) * 16 * kThreads;
  // Occupancy depends only on the shared-memory size: look it up once per size.
  static std::map<size_t, int> occupancy;
  static std::mutex occupancy_mu;
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(occupancy_mu);
    auto it = occupancy.find(smem_bytes);
    if (it == occupancy.end()) {
      QG_CUDA_CHECK("fused_observe_quantize", cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                                  &per_sm, kernel, kThreads, smem_bytes));
      it = occupancy.emplace(smem_bytes, per_sm).first;
    }
    per_sm = it->second;
  }
  int64_t resident = int64_t{per_sm} * multiprocessor_count();
  int64_t want = (packs + kThreads - 1) / kThreads;
  unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, want)));
  Tensor partials = Tensor::empty({static_cast<int64_t>(grid * sizeof(MinMax))}, DType::u8,
                                  ctx.inputs[0].device());
  const T* x = in_ptr<T>(ctx.inputs[0]);
  void* y = ctx.outputs[0].raw_data();
  uint32_t* mask = out_ptr<uint32_t>(ctx.outputs[1]);
  MinMax* part = out_ptr<MinMax>(partials);
  FusedArgs args = a;
  void* params[] = {&x, &y, &mask, &packs, &part, &smem_packs, &args};
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(grid),
                                            dim3(kThreads), params, smem_bytes, stream));
  QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
}

// Launches a persistent grid of `kernel` (exactly the blocks resident at once) for `work`
// units of `units_per_block` each.
template <typename Kernel>
unsigned persistent_grid(Kernel kernel, int64_t work, int64_t units_per_block) {
  int per_sm = 0;
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  int64_t resident = int64_t{multiprocessor_count()} * std::max(per_sm, 1);
  int64_t want = (work + units_per_block - 1) / units_per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, want)));
}

template <bool kCodes, typename T>
void launch_tensor_delayed(KernelContext& ctx, const FusedArgs& a, int64_t packs,
                           cudaStream_t stream) {
  // Four resident blocks per multiprocessor, each streaming one contiguous run of packs
  // (a multiple of kThreads packs, so every warp is whole).
  const int64_t blocks_wanted = 4 * int64_t{multiprocessor_count()};
  int64_t per = (packs + blocks_wanted - 1) / blocks_wanted;
  per = (per + kThreads - 1) / kThreads * kThreads;
  const unsigned grid = static_cast<unsigned>((packs + per - 1) / per);
  const Device dev = ctx.inputs[0].device();
  Tensor partials = Tensor::empty({static_cast<int64_t>(grid * sizeof(MinMax))}, DType::u8, dev);
  Tensor ticket = Tensor::empty({1}, DType::i32, dev);
  QG_CUDA_CHECK("fused_observe_quantize",
                cudaMemsetAsync(ticket.raw_data(), 0, sizeof(unsigned), stream));
  fused_tensor_delayed_kernel<kCodes, T><<<grid, kThreads, 0, stream>>>(
      in_ptr<T>(ctx.inputs[0]), ctx.outputs[0].raw_data(), out_ptr<uint32_t>(ctx.outputs[1]), packs,
      per, out_ptr<MinMax>(partials), out_ptr<unsigned>(ticket), a);
  QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
}

template <bool kCodes, typename T>
void launch_rows(KernelContext& ctx, const FusedArgs& a, int64_t rows, int64_t packs_per_row,
                 cudaStream_t stream) {
  // A persistent grid: each block (or warp) walks its rows, so no block waits for a second
  // wave. Occupancy is looked up once per kernel.
  const T* x = in_ptr<T>(ctx.inputs[0]);
  void* y = ctx.outputs[0].raw_data();
  uint32_t* mask = out_ptr<uint32_t>(ctx.outputs[1]);
  if (packs_per_row <= 32 * kRowPacks) {
    static const unsigned grid_cap =
        persistent_grid(fused_warp_rows_kernel<kCodes, T>, INT64_MAX, 1);
    unsigned grid = static_cast<unsigned>(std::min<int64_t>(grid_cap, (rows + 7) / 8));
    fused_warp_rows_kernel<kCodes, T>
        <<<grid, kThreads, 0, stream>>>(x, y, mask, rows, packs_per_row, a);
  } else {
    static const unsigned grid_cap = persistent_grid(fused_rows_kernel<kCodes, T>, INT64_MAX, 1);
    unsigned grid = static_cast<unsigned>(std::min<int64_t>(grid_cap, rows));
    fused_rows_kernel<kCodes, T><<<grid, kThreads, 0, stream>>>(x, y, mask, rows, packs_per_row, a);
  }
  QG_CUDA_CHECK_LAUNCH("fused_observe_quantize");
}

// The scopes whose qparams each cover one contiguous row of x, in qparam order: channels of
// the outermost axis, tokens, and groups along the innermost axis that divide it evenly.
bool contiguous_rows(const ScopeLayout& l, int64_t& rows, int64_t& row_len) {
  switch (l.kind) {
    case ScopeKind::channel:
      if (l.outer != 1) return false;
      rows = l.axis_len;
      row_len = l.inner;
      return true;
    case ScopeKind::token:
      rows = l.outer;
      row_len = l.axis_len * l.inner;
      return true;
    case ScopeKind::group:
      if (l.inner != 1 || l.axis_len % l.group_size != 0) return false;
      rows = l.outer * l.num_groups;
      row_len = l.group_size;
      return true;
    default:
      return false;
  }
}

// kCodes: the quantizer is quantize (s8/u8 codes out) rather than fake_quantize.
template <bool kCodes, typename T>
bool try_single_kernel_as(KernelContext& ctx) {
  constexpr int N = kVec<T>;
  const Node& obs = ctx.node.fused_from.at(0);
  const Tensor& x = ctx.inputs[0];
  if (!aligned16(x.raw_data()) || !aligned16(ctx.outputs[0].raw_data()) ||
      (reinterpret_cast<uintptr_t>(ctx.outputs[1].raw_data()) & 3u) != 0)
    return false;
  ScopeLayout l = scope_layout(obs.op->name, obs.attrs, x.shape());
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  FusedArgs a = make_args(ctx);
  int64_t n = x.numel();
  if (l.kind == ScopeKind::tensor) {
    if (n == 0 || n % (32 * N) != 0) return false;
    if (a.delayed)
      launch_tensor_delayed<kCodes, T>(ctx, a, n / N, stream);
    else
      launch_tensor<kCodes, T>(ctx, a, n / N, stream);
    return true;
  }
  // Rows of whole 32-bit mask words (so rows never share a word) that fit in registers.
  int64_t rows = 0, row_len = 0;
  if (contiguous_rows(l, rows, row_len) && row_len > 0 && row_len % 32 == 0 &&
      row_len / N <= int64_t{kThreads} * kRowPacks) {
    launch_rows<kCodes, T>(ctx, a, rows, row_len / N, stream);
    return true;
  }
  return false;
}

// Picks a single-kernel path when one applies; returns false to fall back.
template <typename T>
bool try_single_kernel(KernelContext& ctx) {
  const Node& q = ctx.node.fused_from.at(1);
  if (q.op->name == "quantize") return try_single_kernel_as<true, T>(ctx);
  if (q.op->name == "fake_quantize") return try_single_kernel_as<false, T>(ctx);
  return false;
}

void fused_observe_quantize_cuda(KernelContext& ctx) {
  bool done = false;
  switch (ctx.inputs[0].dtype()) {
    case DType::f32:
      done = try_single_kernel<float>(ctx);
      break;
    case DType::f16:
      done = try_single_kernel<__half>(ctx);
      break;
    case DType::bf16:
      done = try_single_kernel<__nv_bfloat16>(ctx);
      break;
    default:
      break;
  }
  if (!done) run_fused_observe_quantize_composed(ctx, DeviceType::cuda);
}

}  // namespace

void add_fused_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_observe_quantize")
      .kernels.push_back({DeviceType::cuda, {}, fused_observe_quantize_cuda});
}

}  // namespace qg
