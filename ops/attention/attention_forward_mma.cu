// Tensor-core forward of causal_attention for bf16 and f16 (head dims 64 and 128), flash
// attention 2's scheme: each warp owns 16 query rows of a 64-row block, keeps its q rows as
// A fragments in registers, and walks 64-key tiles of k and v staged in shared memory:
//   S = q k^T      mma m16n8k16, f32 accumulation (products of 16-bit values are exact)
//   mask, scale    on the S fragments, only in tiles that cross the diagonal or seq
//   online softmax the row max over the quad of lanes sharing a row; m, l and O rescaled by
//                  exp(m_old - m_new); l stays a per-lane partial until the end
//   O += P V       P rounded to the input dtype (the A operand), v through ldmatrix.trans
// The first tile holds key 0, which every row sees, so m is finite from then on. The CPU
// keeps P in f32, so the backends agree to the input dtype's rounding.
#include "core/graph.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_mma.cuh"
#include "ops/attention/attention_tiles.cuh"

namespace qg {
namespace {

using namespace cuda;
using namespace cuda::attention;

constexpr int kBlockRows = 64;  // 16 per warp
constexpr int kTileKeys = 64;

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    forward_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ o, float* __restrict__ lse, Dims<float> dims) {
  constexpr int SP = HD + 8, KT = HD / 16, NT = kTileKeys / 8, DT = HD / 8;
  __shared__ alignas(16) T sk[kTileKeys * SP];
  __shared__ alignas(16) T sv[kTileKeys * SP];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t seq = dims.seq, bh = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
  const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);

  // 1. This warp's 16 q rows as A fragments, staged through sk.
  stage16(sk, SP, q + dims.query_base(dims.in.q, bh), dims.in.q.seq, i0, kBlockRows, HD, seq);
  __syncthreads();
  uint32_t qa[KT][4];
  const int ra = warp * 16 + g;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    qa[kk][0] = ld32(&sk[ra * SP + 16 * kk + 2 * t]);
    qa[kk][1] = ld32(&sk[(ra + 8) * SP + 16 * kk + 2 * t]);
    qa[kk][2] = ld32(&sk[ra * SP + 16 * kk + 8 + 2 * t]);
    qa[kk][3] = ld32(&sk[(ra + 8) * SP + 16 * kk + 8 + 2 * t]);
  }
  float oacc[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) oacc[d][0] = oacc[d][1] = oacc[d][2] = oacc[d][3] = 0.f;
  float m[2] = {minus_infinity<float>(), minus_infinity<float>()}, l[2] = {0.f, 0.f};
  const int64_t rows[2] = {i0 + ra, i0 + ra + 8};
  const int64_t warp_first = i0 + warp * 16, warp_last = warp_first + 15;
  const int64_t last = min64(i0 + kBlockRows, seq) - 1;

  for (int64_t j0 = 0; j0 <= last; j0 += kTileKeys) {
    // 2. Stage the k and v tiles (the q fragments are read before the first overwrite).
    __syncthreads();
    stage16(sk, SP, kb, dims.in.k.seq, j0, kTileKeys, HD, seq);
    stage16(sv, SP, vb, dims.in.v.seq, j0, kTileKeys, HD, seq);
    __syncthreads();
    if (j0 > warp_last) continue;  // every key of the tile is after this warp's rows

    // 3. S = q k^T for the warp's 16 rows and the tile's 64 keys.
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const T* kr = &sk[(8 * nt + g) * SP + 16 * kk + 2 * t];
        mma16816<T>(s[nt], qa[kk], ld32(kr), ld32(kr + 8));
      }

    // 4. Scale and mask (keys after the row, or past seq), the row max and the rescaling.
    const bool edge = j0 + kTileKeys - 1 > warp_first || j0 + kTileKeys > seq;
    float tile_max[2] = {minus_infinity<float>(), minus_infinity<float>()};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * dims.scale;
        const int64_t j = j0 + 8 * nt + 2 * t + (e & 1);
        if (edge && (j > rows[e >> 1] || j >= seq)) x = minus_infinity<float>();
        s[nt][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      corr[r] = expf(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      oacc[d][0] *= corr[0];
      oacc[d][1] *= corr[0];
      oacc[d][2] *= corr[1];
      oacc[d][3] *= corr[1];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = expf(s[nt][e] - m[e >> 1]);
        l[e >> 1] += s[nt][e];
      }

      // 5. O += P V: P's C fragments of key tiles 2kk, 2kk + 1 are the A fragment of step kk.
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int vrow = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int d = 0; d < DT; d += 2) {
        uint32_t vb4[4];
        ldmatrix_x4_trans(vb4, &sv[vrow * SP + 8 * d + (lane >> 4) * 8]);
        mma16816<T>(oacc[d], pa, vb4[0], vb4[1]);
        mma16816<T>(oacc[d + 1], pa, vb4[2], vb4[3]);
      }
    }
  }

  // 6. The quad's partial sums, then o = O / l and lse = m + log(l) for rows within seq.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (rows[r] >= seq) continue;
    T* orow = o + (bh * seq + rows[r]) * HD;
#pragma unroll
    for (int d = 0; d < DT; ++d)
      *reinterpret_cast<uint32_t*>(orow + 8 * d + 2 * t) =
          pack2<T>(oacc[d][2 * r] / l[r], oacc[d][2 * r + 1] / l[r]);
    if (t == 0) lse[bh * seq + rows[r]] = m[r] + logf(l[r]);
  }
}

}  // namespace

template <typename T, int HD>
void launch_forward_mma(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in) {
  check_vector_aligned(ctx, in);
  const int64_t tiles = (a.seq + kBlockRows - 1) / kBlockRows;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.batch * a.heads));
  forward_mma_kernel<T, HD><<<grid, kThreads, 0, cuda_stream(ctx.device)>>>(
      in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
      out_ptr<T>(ctx.outputs[0]), out_ptr<float>(ctx.outputs[1]), attention_dims<float>(a, in));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template void launch_forward_mma<__nv_bfloat16, 64>(KernelContext&, const AttentionLayout&,
                                                    const AttentionStrides&);
template void launch_forward_mma<__nv_bfloat16, 128>(KernelContext&, const AttentionLayout&,
                                                     const AttentionStrides&);
template void launch_forward_mma<__half, 64>(KernelContext&, const AttentionLayout&,
                                             const AttentionStrides&);
template void launch_forward_mma<__half, 128>(KernelContext&, const AttentionLayout&,
                                              const AttentionStrides&);

}  // namespace qg
