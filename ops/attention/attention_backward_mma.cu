// Tensor-core backward of causal_attention for bf16 and f16 (head dims 64 and 128), flash
// attention 2's arithmetic in two kernels and no atomics (the result does not depend on
// scheduling); p = exp(s * scale - lse) is recomputed from the saved lse. The operands of
// every mma are 16-bit (q, k, v, do as given; P and dS rounded to the input dtype, as flash
// attention does), the accumulation f32.
//   dq:     each warp owns 16 query rows (q and do as A fragments in registers) and walks
//           32-key tiles: S = q k^T, dP = do v^T, dS = P (dP - D), dq += dS k.
//   dk, dv: each warp owns 16 keys of a 64-key block (k and v staged once) and walks the
//           query heads of the KV group and their 32-query tiles from the block's first key:
//           S^T = k q^T, dP^T = v do^T, dv += P^T do, dk += dS^T q.
// D = do . o comes from attention_backward.cu's delta kernel.
#include "core/graph.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_mma.cuh"
#include "ops/attention/attention_tiles.cuh"

namespace qg {
namespace {

using namespace cuda;
using namespace cuda::attention;

constexpr int kQueryBlock = 64;  // dq: 16 query rows per warp
constexpr int kKeyTile = 32;     // dq: keys per tile
constexpr int kKeyBlock = 64;    // dk, dv: 16 keys per warp
constexpr int kQueryTile = 32;   // dk, dv: queries per tile

// The A fragment of rows r, r + 8 and columns 16 kk .. 16 kk + 15 of a staged tile.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int stride, int r, int kk,
                                       int t) {
  a[0] = ld32(&tile[r * stride + 16 * kk + 2 * t]);
  a[1] = ld32(&tile[(r + 8) * stride + 16 * kk + 2 * t]);
  a[2] = ld32(&tile[r * stride + 16 * kk + 8 + 2 * t]);
  a[3] = ld32(&tile[(r + 8) * stride + 16 * kk + 8 + 2 * t]);
}

// C fragments of column tiles 2 kk and 2 kk + 1, rounded to T: the A fragment of k-step kk.
template <typename T, int N>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc[DT] += A (16 x 16, k-step kk of the tile rows) times rows 16 kk .. 16 kk + 15 of a
// staged [rows, HD] tile as B (k = tile row, n = column), through ldmatrix.trans.
template <typename T, int HD>
__device__ __forceinline__ void mma_rows(float (&acc)[HD / 8][4], const uint32_t (&a)[4],
                                         const T* tile, int stride, int kk, int lane) {
  const int row = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int d = 0; d < HD / 8; d += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, &tile[row * stride + 8 * d + (lane >> 4) * 8]);
    mma16816<T>(acc[d], a, b[0], b[1]);
    mma16816<T>(acc[d + 1], a, b[2], b[3]);
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dq_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ dout, const float* __restrict__ lse,
                  const float* __restrict__ delta, T* __restrict__ dq, Dims<float> dims) {
  constexpr int SP = HD + 8, KT = HD / 16, NT = kKeyTile / 8, DT = HD / 8;
  __shared__ alignas(16) T buf[kQueryBlock * SP];  // q, then do, then the k and v tiles
  T* sk = buf;
  T* sv = buf + kKeyTile * SP;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t seq = dims.seq, bh = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kQueryBlock;
  const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
  const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);
  const int ra = warp * 16 + g;
  uint32_t qa[KT][4], da[KT][4];
  stage16(buf, SP, q + dims.query_base(dims.in.q, bh), dims.in.q.seq, i0, kQueryBlock, HD, seq);
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) load_a(qa[kk], buf, SP, ra, kk, t);
  __syncthreads();
  stage16(buf, SP, dout + dims.query_base(dims.in.dout, bh), dims.in.dout.seq, i0, kQueryBlock, HD,
          seq);
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) load_a(da[kk], buf, SP, ra, kk, t);
  const int64_t rows[2] = {i0 + ra, i0 + ra + 8};
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = min64(rows[r], seq - 1);
    row_lse[r] = lse[dims.query_row(dims.in.lse, bh, i)];
    row_delta[r] = delta[bh * seq + i];
  }
  float acc[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;
  const int64_t warp_last = i0 + warp * 16 + 15;
  const int64_t last = min64(i0 + kQueryBlock, seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kKeyTile) {
    __syncthreads();  // the fragments (or the previous tile) are read
    stage16(sk, SP, kb, dims.in.k.seq, j0, kKeyTile, HD, seq);
    stage16(sv, SP, vb, dims.in.v.seq, j0, kKeyTile, HD, seq);
    __syncthreads();
    if (j0 > warp_last) continue;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const T* kr = &sk[(8 * nt + g) * SP + 16 * kk + 2 * t];
        const T* vr = &sv[(8 * nt + g) * SP + 16 * kk + 2 * t];
        mma16816<T>(s[nt], qa[kk], ld32(kr), ld32(kr + 8));
        mma16816<T>(dp[nt], da[kk], ld32(vr), ld32(vr + 8));
      }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = j0 + 8 * nt + 2 * t + (e & 1);
        // Row 0's dS is exactly 0 (its softmax has one key: attention_backward.cu).
        const float p = j > rows[r] || j >= seq || rows[r] == 0
                            ? 0.f
                            : expf(s[nt][e] * dims.scale - row_lse[r]);
        s[nt][e] = p * (dp[nt][e] - row_delta[r]);  // dS
      }
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(a, s, kk);
      mma_rows<T, HD>(acc, a, sk, SP, kk, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= seq) continue;
    T* out = dq + (bh * seq + rows[r]) * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d)
      *reinterpret_cast<uint32_t*>(out + 8 * d + 2 * t) =
          pack2<T>(acc[d][2 * r] * dims.scale, acc[d][2 * r + 1] * dims.scale);
  }
}

template <int HD, typename T>
constexpr int dkdv_shared_bytes() {
  return (2 * kKeyBlock + 2 * kQueryTile) * (HD + 8) * static_cast<int>(sizeof(T)) +
         2 * kQueryTile * static_cast<int>(sizeof(float));
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dkdv_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                    Dims<float> dims) {
  constexpr int SP = HD + 8, KT = HD / 16, NT = kQueryTile / 8, DT = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);
  T* sv = sk + kKeyBlock * SP;
  T* sq = sv + kKeyBlock * SP;
  T* sdo = sq + kQueryTile * SP;
  float* slse = reinterpret_cast<float*>(sdo + kQueryTile * SP);
  float* sdelta = slse + kQueryTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t seq = dims.seq, kvh = blockIdx.y;
  const int64_t n = kvh / dims.kv_heads, kv_head = kvh % dims.kv_heads;
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * kKeyBlock;
  stage16(sk, SP, k + dims.kv_base(dims.in.k, kvh), dims.in.k.seq, key0, kKeyBlock, HD, seq);
  stage16(sv, SP, v + dims.kv_base(dims.in.v, kvh), dims.in.v.seq, key0, kKeyBlock, HD, seq);
  const int ra = warp * 16 + g;
  const int64_t keys[2] = {key0 + ra, key0 + ra + 8};
  const int64_t warp_first = key0 + warp * 16;
  float ak[DT][4], av[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) ak[d][e] = av[d][e] = 0.f;
  for (int64_t hh = 0; hh < dims.group; ++hh) {
    const int64_t h = kv_head * dims.group + hh, bh = n * dims.heads + h;
    const T* qb = q + dims.in.q.at(n, h, 0);
    const T* dob = dout + dims.in.dout.at(n, h, 0);
    const float* lse_b = lse + dims.in.lse.at(n, h, 0);
    for (int64_t i0 = key0; i0 < seq; i0 += kQueryTile) {
      __syncthreads();  // the previous tile is consumed (and sk, sv are staged)
      stage16(sq, SP, qb, dims.in.q.seq, i0, kQueryTile, HD, seq);
      stage16(sdo, SP, dob, dims.in.dout.seq, i0, kQueryTile, HD, seq);
      if (threadIdx.x < kQueryTile) {
        const int64_t i = min64(i0 + threadIdx.x, seq - 1);
        slse[threadIdx.x] = lse_b[i * dims.in.lse.seq];
        sdelta[threadIdx.x] = delta[bh * seq + i];
      }
      __syncthreads();
      if (i0 + kQueryTile - 1 < warp_first) continue;  // every query is before these keys
      float s[NT][4], dp[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, sk, SP, ra, kk, t);
        load_a(va, sv, SP, ra, kk, t);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const T* qr = &sq[(8 * nt + g) * SP + 16 * kk + 2 * t];
          const T* dr = &sdo[(8 * nt + g) * SP + 16 * kk + 2 * t];
          mma16816<T>(s[nt], ka, ld32(qr), ld32(qr + 8));
          mma16816<T>(dp[nt], va, ld32(dr), ld32(dr + 8));
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * nt + 2 * t + (e & 1);
          const int64_t i = i0 + c;
          const bool seen = i >= keys[e >> 1] && i < seq;
          const float p = seen ? expf(s[nt][e] * dims.scale - slse[c]) : 0.f;
          s[nt][e] = p;
          dp[nt][e] = i > 0 ? p * (dp[nt][e] - sdelta[c]) : 0.f;  // dS^T; row 0's is 0
        }
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 16; ++kk) {
        uint32_t pa[4], dsa[4];
        c_to_a<T>(pa, s, kk);
        c_to_a<T>(dsa, dp, kk);
        mma_rows<T, HD>(av, pa, sdo, SP, kk, lane);
        mma_rows<T, HD>(ak, dsa, sq, SP, kk, lane);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= seq) continue;
    const int64_t row = (kvh * seq + keys[r]) * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      *reinterpret_cast<uint32_t*>(dk + row + 8 * d + 2 * t) =
          pack2<T>(ak[d][2 * r] * dims.scale, ak[d][2 * r + 1] * dims.scale);
      *reinterpret_cast<uint32_t*>(dv + row + 8 * d + 2 * t) =
          pack2<T>(av[d][2 * r], av[d][2 * r + 1]);
    }
  }
}

}  // namespace

// Called by attention_backward.cu after its delta kernel (and check_vector_aligned); `delta`
// is f32 [rows].
template <typename T, int HD>
void launch_backward_mma(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in,
                         const float* delta) {
  cudaStream_t stream = cuda_stream(ctx.device);
  const T* q = in_ptr<T>(ctx.inputs[0]);
  const T* k = in_ptr<T>(ctx.inputs[1]);
  const T* v = in_ptr<T>(ctx.inputs[2]);
  const float* lse = in_ptr<float>(ctx.inputs[4]);
  const T* dout = in_ptr<T>(ctx.inputs[5]);
  const Dims<float> dims = attention_dims<float>(a, in);
  const int64_t q_blocks = (a.seq + kQueryBlock - 1) / kQueryBlock;
  dq_mma_kernel<T, HD>
      <<<dim3(static_cast<unsigned>(q_blocks), static_cast<unsigned>(a.batch * a.heads)), kThreads,
         0, stream>>>(q, k, v, dout, lse, delta, out_ptr<T>(ctx.outputs[0]), dims);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  // Over the 48 KiB of static shared memory for head dim 128: opt in (a host-side setting,
  // no stream work, so it is legal while a CUDA graph is captured).
  constexpr int bytes = dkdv_shared_bytes<HD, T>();
  QG_CUDA_CHECK(ctx.op, cudaFuncSetAttribute(dkdv_mma_kernel<T, HD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const int64_t k_blocks = (a.seq + kKeyBlock - 1) / kKeyBlock;
  dkdv_mma_kernel<T, HD>
      <<<dim3(static_cast<unsigned>(k_blocks), static_cast<unsigned>(a.batch * a.kv_heads)),
         kThreads, bytes, stream>>>(q, k, v, dout, lse, delta, out_ptr<T>(ctx.outputs[1]),
                                    out_ptr<T>(ctx.outputs[2]), dims);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template void launch_backward_mma<__nv_bfloat16, 64>(KernelContext&, const AttentionLayout&,
                                                     const AttentionStrides&, const float*);
template void launch_backward_mma<__nv_bfloat16, 128>(KernelContext&, const AttentionLayout&,
                                                      const AttentionStrides&, const float*);
template void launch_backward_mma<__half, 64>(KernelContext&, const AttentionLayout&,
                                              const AttentionStrides&, const float*);
template void launch_backward_mma<__half, 128>(KernelContext&, const AttentionLayout&,
                                               const AttentionStrides&, const float*);

}  // namespace qg
