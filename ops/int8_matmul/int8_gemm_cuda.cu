// Int8 tensor-core GEMM for the integer forward of the 8da4w / w8a8 QAT linears, exact to the
// contract in int8_gemm_cuda.cuh (bit for bit with the CPU reference).
//
// Structure:
// - 8 warps (2 x 4) per block, 128 x kBN output tile: kBN = 128 (64x32 per warp) while f32
//   group accumulators are live in the k loop, next to the int32 ones; 256 (64x64 per warp)
//   for per-channel scales, where only the int32 ones are. k advances in stages of kBK bytes
//   brought in by a kStages-deep cp.async pipeline with one barrier per stage. Tile rows are
//   kBK bytes of 16-byte chunks stored XOR-swizzled by row, so the 8 row addresses of every
//   ldmatrix phase hit distinct banks without padding. Fragments are double-buffered in
//   registers: the next k step's (the next stage's first, across a stage) are loaded before
//   the current step's mma issue.
// - mma.sync m16n8k32 s8 x s8 -> s32 on the raw codes gives S = sum a*w per 32-wide k step;
//   the zero point is folded in per group as p = S - a_zero[m] * sum_k w[n,k]. The weight
//   group sums come from the W tile already in shared memory (dp4a against 0x01010101), one
//   stage ahead of their use, published with the group's w_scale as {w_scale, sum} pairs
//   (one 16-byte load gives a thread both for its two columns). The top of iteration s
//   therefore waits for stage s + 1, not s: one stage of the prefetch depth pays for the sums.
// - Flush (once per group, per accumulator) for group <= 256: the mma of the group's first k
//   step starts from C = 0x4B400000, the bits of 1.5 * 2^23; since |S| <= 2^22 the float with
//   the accumulated bits is exactly 1.5 * 2^23 + S, and
//     t   = bits_as_float - 1.5 * 2^23          (= S, exact)
//     fp  = fma(-a_zero, wsum, t)               (= p, exact: every term is an integer < 2^24)
//     acc = fma(fp, w_scale, acc)               (the contract's own fma)
//   i.e. three full-rate FP32 ops, no integer-to-float conversion (quarter rate on sm_90) and
//   no accumulator reset. At group = 32 this work outweighs the mma, so the group loop is
//   unrolled to make every first / last step a compile-time fact (no branches between the
//   mma and the flush). Groups > 256 can exceed the 2^22 range: there the mma starts from 0,
//   p = S - a_zero * wsum is an IMAD and __int2float_rn converts, at most every 9 k steps
//   (per-channel: once, after the k loop).
// - The epilogue multiplies by a_scale (one f32 multiply; the tile's a_scale rows come into
//   shared memory with the first stage) and rounds once to the output type, into a padded copy
//   of the tile in the freed stage memory, which the block then writes out in coalesced
//   16-byte chunks.
// Profile (ncu, H200, 8192 x 1024 x 1024): one block of 8 warps per SM, 2 warps per
// scheduler, no eligible warp in ~70% of cycles. Per channel, ~40% of the warp samples sat in
// the once-per-tile code: the epilogue's 4-byte stores (each FMUL waiting on the previous
// store's register) and its a_scale loads, and the a_zero loads issued before the prologue's
// stages; in the k loop, two run-time integer divisions per stage (group index, group end)
// that a per-channel tile does not need. Those are gone. Left: the k loop issues an mma only
// every ~2.5x the register-only ceiling's interval (fixed-latency 'wait' stalls between
// mmas of one warp with 2 warps per scheduler), and at group = 32 the three FP32 flush
// operations per accumulator and group, which outweigh the mma. Bank conflicts: none on the
// ldmatrix loads (swizzle verified).
#include "ops/int8_matmul/int8_gemm_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "device/cuda/cuda_check.h"

namespace qg::int8_gemm {
namespace {

constexpr int kBM = 128;
constexpr int kMaxMagicGroup = 256;
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23

// Tile shape and pipeline. Measured on an H200 (bench/int8_gemm): 6 stages instead of 5,
// 128-byte stages instead of 64, and 16 warps (4 x 4; the kernel takes kWarpsM = 4) instead of
// 8 all timed within a few percent of this configuration, and a 128-wide per-channel tile
// 10-30% slower than the 256-wide one.
constexpr int kBK = 64;  // bytes of k per stage (64 or 128)
constexpr int kStages = 5;
constexpr int kBNGroups = 128;
constexpr int kBNSingle = 256;
constexpr int kWarpsMGroups = 2;
constexpr int kWarpsMSingle = 2;
static_assert(kBK == 64 || kBK == 128, "tile rows are 4 or 8 chunks of 16 bytes");
static_assert(kStages >= 3, "the sums look one stage ahead");

constexpr int kSteps = kBK / 32;   // mma k steps per stage
constexpr int kChunks = kBK / 16;  // 16-byte chunks per tile row
// Per stage: A tile, W tile, then the w_scale of each k step's group, [kSteps][kBN]. After
// the stages: the double-buffered {w_scale, group sum} pairs, [2][kSteps][kBN], then the
// tile's a_scale rows, [kBM].
template <int kBN>
constexpr int kStageBytesOf = kBM* kBK + kBN* kBK + kSteps* kBN * 4;
template <int kBN>
constexpr int kSmemBytesOf = kStages* kStageBytesOf<kBN> + 2 * kSteps* kBN * 8 + kBM * 4;

struct Params {
  int m, n, k, group, spg, groups_per_row;
  const int8_t* a;
  const float* a_scale;
  const int32_t* a_zero;
  const int8_t* w;
  const float* w_scale;
  void* y;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Zero-fills the destination when `valid` is false (src-size 0 reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d = a * b + c, 16x8x32, s8 x s8 -> s32 (wrapping; the contract keeps every result exact).
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                       int c0, int c1, int c2, int c3) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c0), "r"(c1), "r"(c2),
        "r"(c3));
}

template <OutType kOut>
struct OutElem;
template <>
struct OutElem<OutType::f32> {
  using type = float;
};
template <>
struct OutElem<OutType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct OutElem<OutType::f16> {
  using type = __half;
};

template <OutType kOut>
__device__ __forceinline__ void store_pair(typename OutElem<kOut>::type* dst, float v0, float v1,
                                           bool two, bool vec) {
  if constexpr (kOut == OutType::f32) {
    if (vec) {
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else {
      dst[0] = v0;
      if (two) dst[1] = v1;
    }
  } else if constexpr (kOut == OutType::bf16) {
    const __nv_bfloat16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
    if (vec) {
      *reinterpret_cast<__nv_bfloat162*>(dst) = __halves2bfloat162(h0, h1);
    } else {
      dst[0] = h0;
      if (two) dst[1] = h1;
    }
  } else {
    const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
    if (vec) {
      *reinterpret_cast<__half2*>(dst) = __halves2half2(h0, h1);
    } else {
      dst[0] = h0;
      if (two) dst[1] = h1;
    }
  }
}

// Byte offset of 16-byte chunk `c` of tile row `r`. The 8 rows an ldmatrix phase reads are
// 8 consecutive rows at one logical chunk; the XOR spreads them over all 32 banks (64-byte
// rows: two rows per 128 bytes, so the phase comes from rows / 2).
__device__ __forceinline__ int swz(int r, int c) {
  if constexpr (kBK == 64) return r * kBK + ((c ^ ((r >> 1) & 3)) << 4);
  return r * kBK + ((c ^ (r & 7)) << 4);
}

// kBN: output tile width (128 or 256). kSpg: mma k steps per group when fixed at compile
// time (1, 2, 4, 8), 0 = p.spg at run time. kMagicPath: group <= 256, flush through the
// 1.5 * 2^23 bias (see top comment), else IMAD + I2F. kSingle: group == k, one flush after the
// k loop.
template <int kBN, int kWarpsM, int kSpg, bool kMagicPath, bool kSingle, OutType kOut>
__global__ void __launch_bounds__(kWarpsM * 4 * 32, 1) int8_gemm_kernel(const Params p) {
  constexpr int kWarpsN = 4;
  constexpr int kThreads = kWarpsM * kWarpsN * 32;
  constexpr int kWarpRows = kBM / kWarpsM;
  constexpr int kWarpCols = kBN / kWarpsN;
  constexpr int kMT = kWarpRows / 16;  // m16 tiles per warp
  constexpr int kNT = kWarpCols / 8;   // n8 tiles per warp
  static_assert(kNT % 2 == 0, "W fragments load two n8 tiles per ldmatrix");
  // 8 warps double-buffer the fragments in registers to cover the ldmatrix latency; 16 warps
  // (4 per scheduler) cover it by switching warps and need the registers (128 per thread).
  constexpr bool kFragPrefetch = kWarpsM == 2;
  constexpr int kATileBytes = kBM * kBK;
  constexpr int kWTileBytes = kBN * kBK;
  constexpr int kStageBytes = kStageBytesOf<kBN>;
  constexpr int kLdRows = kThreads / kChunks;  // tile rows one loader pass covers
  constexpr int kAPasses = kBM / kLdRows;
  constexpr int kWPasses = kBN / kLdRows;
  // Columns one pass of the sums covers; with more threads than (column, step) pairs the
  // surplus warps skip the sums (whole warps: kSteps * kBN is a multiple of 32).
  constexpr int kSumCols = kThreads / kSteps < kBN ? kThreads / kSteps : kBN;
  constexpr int kSumPasses = kBN / kSumCols;
  constexpr int kBias = kMagicPath ? kMagicBits : 0;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const pairs = smem + kStages * kStageBytes;
  const float* const a_scale_s = reinterpret_cast<const float*>(pairs + 2 * kSteps * kBN * 8);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;

  // Blocks sweep 8 M tiles per W tile, so consecutive blocks share the W tile in L2 and the
  // A rows of the sweep stay resident across W tiles.
  const int tiles_m = (p.m + kBM - 1) / kBM;
  const int tiles_n = (p.n + kBN - 1) / kBN;
  constexpr int kSweep = 8;
  const int per_sweep = kSweep * tiles_n;
  const int sweep = blockIdx.x / per_sweep;
  const int first_m = sweep * kSweep;
  const int sweep_m = min(tiles_m - first_m, kSweep);
  const int in_sweep = blockIdx.x - sweep * per_sweep;
  const int m0 = (first_m + in_sweep % sweep_m) * kBM;
  const int n0 = (in_sweep / sweep_m) * kBN;

  const int K = p.k;
  const int nstages = (K + kBK - 1) / kBK;
  const int spg = kSpg > 0 ? kSpg : p.spg;

  // Loader: thread t moves chunk t % kChunks of rows t / kChunks + kLdRows i of both tiles.
  // kLdRows is a multiple of 8, so all passes share the swizzle phase and one offset.
  const int ld_row = tid / kChunks;
  const int ld_c = tid % kChunks;
  const uint32_t ld_off = swz(ld_row, ld_c);
  const int8_t* a_src[kAPasses];
  bool a_ok[kAPasses];
#pragma unroll
  for (int i = 0; i < kAPasses; ++i) {
    const int r = m0 + ld_row + i * kLdRows;
    a_ok[i] = r < p.m;
    a_src[i] = p.a + (a_ok[i] ? int64_t(r) * K : 0) + ld_c * 16;
  }
  const int8_t* w_src[kWPasses];
  bool w_ok[kWPasses];
#pragma unroll
  for (int i = 0; i < kWPasses; ++i) {
    const int r = n0 + ld_row + i * kLdRows;
    w_ok[i] = r < p.n;
    w_src[i] = p.w + (w_ok[i] ? int64_t(r) * K : 0) + ld_c * 16;
  }
  // Thread t owns k step t % kSteps of every stage, for columns t / kSteps + kSumCols i: the
  // w_scale loads and the weight sums.
  const int s_q = tid % kSteps;
  const int s_n = tid / kSteps;
  const bool s_thread = s_n < kSumCols;
  const float* ws_row[kSumPasses];
  bool s_ok[kSumPasses];
#pragma unroll
  for (int i = 0; i < kSumPasses; ++i) {
    const int c = n0 + s_n + i * kSumCols;
    s_ok[i] = c < p.n;
    ws_row[i] = p.w_scale + (s_ok[i] ? int64_t(c) * p.groups_per_row : 0);
  }

  const uint32_t smem_base = smem_u32(smem);
  // Rows or k beyond the matrices are zero-filled: they add 0 to S, and a k step past K is a
  // step of zero codes whose group (if it completes one) has w_scale 0 and sum 0, so its flush
  // adds fma(+0, +0, acc) = acc (acc is never -0: it starts at +0 and every term is a
  // multiple of the smallest subnormal, so a zero sum is an exact +0).
  auto load_stage = [&](int s) {
    const uint32_t st = smem_base + (s % kStages) * kStageBytes;
    const int k0 = s * kBK;
    const bool k_ok = k0 + ld_c * 16 < K;  // K % 32 == 0: a chunk is all in or all out
    const int kk = k_ok ? k0 : 0;
#pragma unroll
    for (int i = 0; i < kAPasses; ++i)
      cp_async16(st + ld_off + i * kLdRows * kBK, a_src[i] + kk, a_ok[i] && k_ok);
#pragma unroll
    for (int i = 0; i < kWPasses; ++i)
      cp_async16(st + kATileBytes + ld_off + i * kLdRows * kBK, w_src[i] + kk, w_ok[i] && k_ok);
    const int kq = k0 + 32 * s_q;
    const bool q_ok = kq < K;
    // Per-channel: one group, no division in the k loop.
    const int g = kSingle || !q_ok ? 0 : (kSpg > 0 ? (kq >> 5) / kSpg : kq / p.group);
    if (!s_thread) return;
#pragma unroll
    for (int i = 0; i < kSumPasses; ++i) {
      const bool ok = s_ok[i] && q_ok;
      cp_async4(st + kATileBytes + kWTileBytes + (s_q * kBN + s_n + i * kSumCols) * 4,
                ws_row[i] + (ok ? g : 0), ok);
    }
  };

  // Whether mma k step e ends a group.
  const int last_step = K / 32 - 1;
  auto ends = [&](int e) { return kSingle ? e == last_step : (e + 1) % spg == 0; };

  // Weight sums of stage s (its W tile has landed): the running sum over the group's k so
  // far, published with the group's w_scale into pair slot s % 2 for the steps that end one.
  int run[kSumPasses];
#pragma unroll
  for (int i = 0; i < kSumPasses; ++i) run[i] = 0;
  auto stage_sums = [&](int s) {
    if (!s_thread) return;
    const uint8_t* wt = smem + (s % kStages) * kStageBytes + kATileBytes;
    const int e0 = s * kSteps;
#pragma unroll
    for (int i = 0; i < kSumPasses; ++i) {
      const int n = s_n + i * kSumCols;
      const int4 q0 = *reinterpret_cast<const int4*>(wt + swz(n, 2 * s_q));
      const int4 q1 = *reinterpret_cast<const int4*>(wt + swz(n, 2 * s_q + 1));
      constexpr int kOnes = 0x01010101;
      int part = __dp4a(q0.x, kOnes, 0);
      part = __dp4a(q0.y, kOnes, part);
      part = __dp4a(q0.z, kOnes, part);
      part = __dp4a(q0.w, kOnes, part);
      part = __dp4a(q1.x, kOnes, part);
      part = __dp4a(q1.y, kOnes, part);
      part = __dp4a(q1.z, kOnes, part);
      part = __dp4a(q1.w, kOnes, part);
      // The kSteps owners of column n are adjacent lanes; each replays the column's running
      // sum over the stage's steps in order and keeps the value at its own step.
      int mine = 0;
#pragma unroll
      for (int q = 0; q < kSteps; ++q) {
        run[i] += __shfl_sync(0xffffffffu, part, (lane & ~(kSteps - 1)) | q);
        if (q == s_q) mine = run[i];
        if (ends(e0 + q)) run[i] = 0;
      }
      if (ends(e0 + s_q)) {
        const float ws = *reinterpret_cast<const float*>(wt + kWTileBytes + (s_q * kBN + n) * 4);
        // Magic path: the sum as a float (exact, |sum| <= 2^15); else its bits, for the IMAD.
        const float sum_f = kMagicPath ? __int2float_rn(mine) : __int_as_float(mine);
        *reinterpret_cast<float2*>(pairs + (((s & 1) * kSteps + s_q) * kBN + n) * 8) =
            make_float2(ws, sum_f);
      }
    }
  };

  // Rows of this thread's accumulators: i-th m16 tile, +0 / +8. Their -a_zero are loaded
  // after the prologue's stages are in flight (below).
  const int row_base = warp_m * kWarpRows + (lane >> 2);
  float naz_f[kMT][2];
  int naz_i[kMT][2];

  int x[kMT][kNT][4];  // int32 accumulators of the current group (biased on the magic path)
  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        x[i][j][c] = kBias;
        acc[i][j][c] = 0.0f;
      }

  // Per-lane ldmatrix offsets. A: lanes 0-15 rows 0-15 of the m16 tile at the step's first
  // chunk, lanes 16-31 the same rows at its second (a0..a3 of m16n8k32). W: lanes 0-7 / 8-15
  // rows 0-7 at the first / second chunk (b0, b1 of one n8 tile), lanes 16-31 the same for
  // the next n8 tile. Tile offsets are multiples of 8 rows, which keep the swizzle phase.
  const int a_row = warp_m * kWarpRows + (lane & 15);
  const int b_row = warp_n * kWarpCols + (lane & 7) + ((lane >> 4) << 3);
  uint32_t a_off[kSteps], b_off[kSteps];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    a_off[j] = swz(a_row, 2 * j + (lane >> 4));
    b_off[j] = kATileBytes + swz(b_row, 2 * j + ((lane >> 3) & 1));
  }
  const int col_base = warp_n * kWarpCols + 2 * (lane & 3);

  struct Frag {
    uint32_t a[kMT][4];
    uint32_t b[kNT][2];
  };
  auto load_frag = [&](Frag& f, uint32_t st, int j) {
#pragma unroll
    for (int i = 0; i < kMT; ++i) ldsm_x4(f.a[i], st + a_off[j] + i * 16 * kBK);
#pragma unroll
    for (int jj = 0; jj < kNT / 2; ++jj) {
      uint32_t r[4];
      ldsm_x4(r, st + b_off[j] + jj * 16 * kBK);
      f.b[2 * jj][0] = r[0];
      f.b[2 * jj][1] = r[1];
      f.b[2 * jj + 1][0] = r[2];
      f.b[2 * jj + 1][1] = r[3];
    }
  };
  auto mma_all = [&](const Frag& f, bool first) {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        if (first) {
          mma_s8(x[i][n], f.a[i], f.b[n], kBias, kBias, kBias, kBias);
        } else {
          mma_s8(x[i][n], f.a[i], f.b[n], x[i][n][0], x[i][n][1], x[i][n][2], x[i][n][3]);
        }
      }
  };
  auto flush = [&](int slot, int j) {
    const uint8_t* pr = pairs + ((slot * kSteps + j) * kBN) * 8;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      // {w_scale, sum} of columns c and c + 1.
      const float4 v = *reinterpret_cast<const float4*>(pr + (col_base + n * 8) * 8);
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float ws = (c & 1) ? v.z : v.x;
          const float sum = (c & 1) ? v.w : v.y;
          float fp;
          if constexpr (kMagicPath) {
            const float t = __fsub_rn(__int_as_float(x[i][n][c]), kMagic);
            fp = __fmaf_rn(naz_f[i][c >> 1], sum, t);
          } else {
            fp = __int2float_rn(x[i][n][c] + naz_i[i][c >> 1] * __float_as_int(sum));
          }
          acc[i][n][c] = __fmaf_rn(fp, ws, acc[i][n][c]);
          if constexpr (kSpg == 0) x[i][n][c] = kBias;  // the next group starts here
        }
      }
    }
  };

  // Prologue: stages 0 .. kStages - 2 in flight (the tile's a_scale rows with stage 0, for
  // the epilogue); sums and first fragments of stage 0. The a_zero loads go out after the
  // stages so that their latency overlaps the stages' instead of delaying them.
  if (tid < kBM) {
    const bool ok = m0 + tid < p.m;
    cp_async4(smem_u32(a_scale_s + tid), p.a_scale + (ok ? m0 + tid : 0), ok);
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nstages) load_stage(s);
    cp_async_commit();
  }
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + row_base + i * 16 + h * 8;
      const int z = r < p.m ? -p.a_zero[r] : 0;
      naz_i[i][h] = z;
      naz_f[i][h] = __int2float_rn(z);
    }
  }

  cp_async_wait<kStages - 2>();
  __syncthreads();
  stage_sums(0);
  Frag f[2];
  load_frag(f[0], smem_base, 0);

  // With the group size known, whole groups are unrolled so that each step's first / last
  // role is a constant. K % group == 0 makes nstages a multiple of kUnroll.
  constexpr int kUnroll = kSpg > kSteps ? kSpg / kSteps : 1;
  for (int s0 = 0; s0 < nstages; s0 += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u;
      cp_async_wait<kStages - 3>();  // stages s and s + 1 have landed
      __syncthreads();
      if (s + kStages - 1 < nstages) load_stage(s + kStages - 1);
      cp_async_commit();
      const uint32_t st = smem_base + (s % kStages) * kStageBytes;
      const uint32_t st_next = smem_base + ((s + 1) % kStages) * kStageBytes;
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        // The next step's fragments (past the last stage: stale, unused data): before this
        // step's mma with prefetch, after it into the same registers without.
        auto load_next = [&](Frag& dst) {
          if (j + 1 < kSteps) {
            load_frag(dst, st, j + 1);
          } else {
            load_frag(dst, st_next, 0);
          }
        };
        if constexpr (kFragPrefetch) load_next(f[(j + 1) & 1]);
        const int pos = (u * kSteps + j) % (kSpg > 0 ? kSpg : 1);
        mma_all(f[kFragPrefetch ? j & 1 : 0], kSpg > 0 && pos == 0);
        if constexpr (!kFragPrefetch) load_next(f[0]);
        if (j == 0) stage_sums(s + 1);  // past the last stage: unread slot
        if constexpr (!kSingle) {
          const bool last = kSpg > 0 ? pos == kSpg - 1 : ends(s * kSteps + j);
          if (last) flush(s & 1, j);
        }
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (kSingle) {
    const int e = K / 32 - 1;
    flush((e / kSteps) & 1, e % kSteps);
  }

  // Epilogue through shared memory (the stages are free once every warp is past the k loop):
  // each thread puts its scaled, rounded pairs in a padded row-major copy of the tile, then
  // the block writes whole 16-byte chunks of output rows, a warp covering 512 contiguous
  // bytes, instead of 4-byte pieces of 8 rows per warp store.
  using Out = typename OutElem<kOut>::type;
  constexpr int kOutPitch = kBN * int(sizeof(Out)) + 16;  // bytes; the pad spreads the banks
  static_assert(kBM * kOutPitch <= kStages * kStageBytes, "the output tile fits the stages");
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = row_base + i * 16 + h * 8;
      const float as = a_scale_s[rl];
      uint8_t* const srow = smem + rl * kOutPitch;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int cl = col_base + j * 8;
        store_pair<kOut>(reinterpret_cast<Out*>(srow) + cl, __fmul_rn(acc[i][j][2 * h], as),
                         __fmul_rn(acc[i][j][2 * h + 1], as), true, true);
      }
    }
  }
  __syncthreads();
  constexpr int kVec = 16 / int(sizeof(Out));  // outputs per 16-byte chunk
  constexpr int kRowChunks = kBN / kVec;
  static_assert(kBM * kRowChunks % kThreads == 0, "whole passes over the tile");
  Out* const y = static_cast<Out*>(p.y);
  // 16-byte stores need every row start aligned: n a multiple of kVec and y 16-byte aligned.
  const bool vec = p.n % kVec == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0;
#pragma unroll 4
  for (int q = tid; q < kBM * kRowChunks; q += kThreads) {
    const int rl = q / kRowChunks;
    const int cc = q % kRowChunks;
    const int r = m0 + rl;
    const int c = n0 + cc * kVec;
    if (r >= p.m || c >= p.n) continue;
    const uint8_t* const src = smem + rl * kOutPitch + cc * 16;
    Out* const dst = y + int64_t(r) * p.n + c;
    if (vec) {
      *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(src);
    } else {
      const Out* const se = reinterpret_cast<const Out*>(src);
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (c + e < p.n) dst[e] = se[e];
    }
  }
}

template <int kBN, int kWarpsM, int kSpg, bool kMagicPath, bool kSingle, OutType kOut>
void launch_kernel(const Params& prm, cudaStream_t stream, const char* op) {
  auto* kernel = &int8_gemm_kernel<kBN, kWarpsM, kSpg, kMagicPath, kSingle, kOut>;
  constexpr int kSmem = kSmemBytesOf<kBN>;
  // The attribute is per device: set it once for each device this instantiation runs on.
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  QG_CUDA_CHECK(op, cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit == 0 || (configured.load(std::memory_order_acquire) & bit) == 0) {
    QG_CUDA_CHECK(op,
                  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int64_t blocks = ((int64_t(prm.m) + kBM - 1) / kBM) * ((int64_t(prm.n) + kBN - 1) / kBN);
  QG_CHECK(blocks < (int64_t(1) << 31), op, "int8 GEMM: too many tiles (m=", prm.m, ", n=", prm.n,
           ")");
  kernel<<<static_cast<unsigned>(blocks), kWarpsM * 4 * 32, kSmem, stream>>>(prm);
  QG_CUDA_CHECK_LAUNCH(op);
}

template <OutType kOut>
void dispatch(const Params& prm, cudaStream_t stream, const char* op) {
  if (prm.group <= kMaxMagicGroup) {
    switch (prm.spg) {
      case 1:
        return launch_kernel<kBNGroups, kWarpsMGroups, 1, true, false, kOut>(prm, stream, op);
      case 2:
        return launch_kernel<kBNGroups, kWarpsMGroups, 2, true, false, kOut>(prm, stream, op);
      case 4:
        return launch_kernel<kBNGroups, kWarpsMGroups, 4, true, false, kOut>(prm, stream, op);
      case 8:
        return launch_kernel<kBNGroups, kWarpsMGroups, 8, true, false, kOut>(prm, stream, op);
      default:
        return launch_kernel<kBNGroups, kWarpsMGroups, 0, true, false, kOut>(prm, stream, op);
    }
  }
  if (prm.group == prm.k)
    return launch_kernel<kBNSingle, kWarpsMSingle, 0, false, true, kOut>(prm, stream, op);
  // Groups > 256 that are not per-channel: not a shape of the models, kept on 8 warps.
  return launch_kernel<kBNGroups, 2, 0, false, false, kOut>(prm, stream, op);
}

}  // namespace

void launch(const Problem& p, cudaStream_t stream, const char* op) {
  QG_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0 && p.group > 0, op, "int8 GEMM: bad sizes m=", p.m,
           " n=", p.n, " k=", p.k, " group=", p.group);
  QG_CHECK(p.group % 32 == 0 && p.k % p.group == 0 && p.group <= 65536, op,
           "int8 GEMM: needs group % 32 == 0, k % group == 0 and group <= 65536 (k=", p.k,
           ", group=", p.group, ")");
  QG_CHECK(p.m < (int64_t(1) << 31) && p.n < (int64_t(1) << 31) && p.k < (int64_t(1) << 31), op,
           "int8 GEMM: sizes beyond int32 (m=", p.m, ", n=", p.n, ", k=", p.k, ")");
  if (p.m == 0 || p.n == 0) return;
  Params prm;
  prm.m = static_cast<int>(p.m);
  prm.n = static_cast<int>(p.n);
  prm.k = static_cast<int>(p.k);
  prm.group = static_cast<int>(p.group);
  prm.spg = static_cast<int>(p.group / 32);
  prm.groups_per_row = static_cast<int>(p.k / p.group);
  prm.a = p.a;
  prm.a_scale = p.a_scale;
  prm.a_zero = p.a_zero;
  prm.w = p.w;
  prm.w_scale = p.w_scale;
  prm.y = p.y;
  switch (p.out) {
    case OutType::f32:
      return dispatch<OutType::f32>(prm, stream, op);
    case OutType::bf16:
      return dispatch<OutType::bf16>(prm, stream, op);
    case OutType::f16:
      return dispatch<OutType::f16>(prm, stream, op);
  }
  QG_FAIL(op, "int8 GEMM: unknown output type");
}

}  // namespace qg::int8_gemm
