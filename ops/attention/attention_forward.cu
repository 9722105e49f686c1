// CUDA forward of causal_attention for f32 and f64: flash-style tiles with the online
// softmax, SIMT math in M (f32, or f64 for f64) with explicit FMAs. bf16 and f16 take the
// tensor-core kernel of attention_forward_mma.cu.
//   block:  kWarps warps x R query rows each (BR rows of one (batch, head)), the q rows
//           staged in shared memory; the blocks of the last rows (the most keys) start first.
//   tiles:  32 keys at a time, k staged transposed-readable (lane j computes s_j for each of
//           its warp's rows), v staged row-wise (lane l accumulates dims l, l + 32, ...);
//           only tiles with a key j <= the block's last row are read.
//   online: per row, m and l are rescaled by exp(m_old - m_new) tile by tile; the first tile
//           always holds key 0, which every row sees, so m is finite from then on.
#include <algorithm>

#include "core/graph.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_cudnn.h"
#include "ops/attention/attention_mma.cuh"
#include "ops/attention/attention_tiles.cuh"

namespace qg {
namespace {

using namespace cuda;
using namespace cuda::attention;

template <typename T, int HD>
struct ForwardShape {
  static constexpr int SP = padded<T>(HD);
  static constexpr int kFixed =
      static_cast<int>(sizeof(T)) * (kTile * SP + (kTwoTransposed<T> ? kTile * HD : 0));
  static constexpr int R = rows_per_warp<T>(HD, 1, kFixed);
  static constexpr int BR = kWarps * R;
};

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   T* __restrict__ o, math_of<T>* __restrict__ lse, Dims<math_of<T>> dims) {
  using M = math_of<T>;
  using S = ForwardShape<T, HD>;
  constexpr int C = HD / 32, R = S::R, BR = S::BR, SP = S::SP;
  __shared__ T sq[BR * HD];
  __shared__ T sk[kTile * SP];
  __shared__ T sv[kTwoTransposed<T> ? kTile * HD : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t seq = dims.seq, bh = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
  const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);
  const int64_t k_stride = dims.in.k.seq, v_stride = dims.in.v.seq;
  stage(sq, HD, q + dims.query_base(dims.in.q, bh), dims.in.q.seq, i0, BR, HD, seq);

  M m[R], l[R], acc[R][C];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    m[rr] = minus_infinity<M>();
    l[rr] = 0;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[rr][c] = 0;
  }
  const int64_t last = min64(i0 + BR, seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and sq is staged)
    stage(sk, SP, kb, k_stride, j0, kTile, HD, seq);
    if constexpr (kTwoTransposed<T>) stage(sv, HD, vb, v_stride, j0, kTile, HD, seq);
    __syncthreads();
    M s[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) s[rr] = 0;
    for (int c = 0; c < HD; ++c) {
      const M kc = to_math(sk[lane * SP + c]);
#pragma unroll
      for (int rr = 0; rr < R; ++rr) s[rr] = madd(to_math(sq[(warp * R + rr) * HD + c]), kc, s[rr]);
    }
    const int64_t j = j0 + lane;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int64_t i = i0 + warp * R + rr;
      if (i >= seq || j0 > i) continue;  // the same for every lane of the warp
      const M sc = j <= i ? s[rr] * dims.scale : minus_infinity<M>();
      const M m_new = fmax(m[rr], warp_max(sc));
      const M corr = exp(m[rr] - m_new);
      const M p = j <= i ? exp(sc - m_new) : M(0);
      l[rr] = l[rr] * corr + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[rr][c] *= corr;
      const int keys = static_cast<int>(min64(kTile, i - j0 + 1));
      for (int jj = 0; jj < keys; ++jj) {
        const M pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const T vv = kTwoTransposed<T> ? sv[jj * HD + lane + 32 * c]
                                         : vb[(j0 + jj) * v_stride + lane + 32 * c];
          acc[rr][c] = madd(pj, to_math(vv), acc[rr][c]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    if (i >= seq) continue;
    const int64_t row = bh * seq + i;
#pragma unroll
    for (int c = 0; c < C; ++c) o[row * HD + lane + 32 * c] = from_math<T>(acc[rr][c] / l[rr]);
    if (lane == 0) lse[row] = m[rr] + log(l[rr]);
  }
}

template <typename T, int HD>
void launch_forward(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in) {
  using M = math_of<T>;
  const int64_t tiles = (a.seq + ForwardShape<T, HD>::BR - 1) / ForwardShape<T, HD>::BR;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.batch * a.heads));
  forward_kernel<T, HD><<<grid, kThreads, 0, cuda_stream(ctx.device)>>>(
      in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
      out_ptr<T>(ctx.outputs[0]), out_ptr<M>(ctx.outputs[1]), attention_dims<M>(a, in));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

// attention_forward_mma.cu: the tensor-core kernel of bf16 and f16.
template <typename T, int HD>
void launch_forward_mma(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in);
// attention_any_head_dim.cu: head dims other than 64 and 128.
template <typename T>
void launch_forward_any(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in);

void causal_attention_cuda(KernelContext& ctx) {
  const AttentionLayout& a = ctx.args<AttentionArgs>().layout;
  check_cuda_layout(ctx.op, a);
  const AttentionStrides in = attention_strides(ctx);
  if (cudnn_attention::forward(ctx, a)) return;  // QG_ATTENTION_BACKEND (attention_backend.h)
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (!tiled_head_dim(a.head_dim)) {
      launch_forward_any<T>(ctx, a, in);
    } else if constexpr (kHasMma<T>) {
      if (a.head_dim == 64)
        launch_forward_mma<T, 64>(ctx, a, in);
      else
        launch_forward_mma<T, 128>(ctx, a, in);
    } else {
      if (a.head_dim == 64)
        launch_forward<T, 64>(ctx, a, in);
      else
        launch_forward<T, 128>(ctx, a, in);
    }
  });
}

}  // namespace qg
