// CUDA backward of causal_attention, flash-attention-2 style in three kernels; p = exp(s -
// lse) is recomputed from the saved lse, never stored. The delta kernel serves every dtype;
// the dq and dk/dv kernels here are SIMT math in M (f32, f64) with explicit FMAs, and bf16
// and f16 take the tensor-core ones of attention_backward_mma.cu.
//   delta:  D_i = do_i . o_i, one warp per row.
//   dq:     like the forward, per block of query rows of one (batch, head): 32 keys a tile,
//           lane j computes s_ij and dp_ij = do_i . v_j, then ds_ij = p_ij (dp_ij - D_i);
//           lane l accumulates dims l, l + 32, ... of sum_j ds_ij k_j.
//   dk, dv: per block of key rows of one (batch, KV head): the query heads of its group in
//           order, 32 queries a tile from the tile of the block's first key; lane i computes
//           p_ij and ds_ij, and lane l accumulates sum_i p_ij do_i and sum_i ds_ij q_i.
// No atomics: dk and dv are summed over the group inside one block, so the result does not
// depend on scheduling.
// Row 0 sees key 0 only, so its softmax is constant (p_00 = 1 whatever the score) and
// ds_00 = 0 exactly; every kernel sets it so (attention_op.cpp). Computed as dp_00 - D_0 it
// would be do . v_0 - do . o_0 with o_0 = v_0, which cancels only to rounding here (the two
// dots are summed in other orders), and at T = 1 that noise would be all of dq and dk.
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    delta_kernel(const T* __restrict__ o, const T* __restrict__ dout,
                 math_of<T>* __restrict__ delta, Dims<math_of<T>> dims, bool dense, int64_t rows,
                 int hd) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    // Contiguous o and do (the graph's case) skip the divisions that find a view's row: the
    // kernel has little else to do per row.
    const T* orow = o + r * hd;
    const T* dorow = dout + r * hd;
    if (!dense) {
      const int64_t bh = r / dims.seq, i = r % dims.seq;
      orow = o + dims.query_row(dims.in.o, bh, i);
      dorow = dout + dims.query_row(dims.in.dout, bh, i);
    }
    M s = 0;
    for (int c = lane; c < hd; c += 32) s = madd(to_math(dorow[c]), to_math(orow[c]), s);
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
  }
}

template <typename T, int HD>
struct DqShape {
  static constexpr int SP = padded<T>(HD);
  static constexpr int kFixed =
      static_cast<int>(sizeof(T)) * kTile * SP * (kTwoTransposed<T> ? 2 : 1);
  static constexpr int R = rows_per_warp<T>(HD, 2, kFixed);
  static constexpr int BR = kWarps * R;
};

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              const T* __restrict__ dout, const math_of<T>* __restrict__ lse,
              const math_of<T>* __restrict__ delta, T* __restrict__ dq, Dims<math_of<T>> dims) {
  using M = math_of<T>;
  using S = DqShape<T, HD>;
  constexpr int C = HD / 32, R = S::R, BR = S::BR, SP = S::SP;
  __shared__ T sq[BR * HD];
  __shared__ T sdo[BR * HD];
  __shared__ T sk[kTile * SP];
  __shared__ T sv[kTwoTransposed<T> ? kTile * SP : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t seq = dims.seq, bh = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
  const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);
  const int64_t k_stride = dims.in.k.seq, v_stride = dims.in.v.seq;
  stage(sq, HD, q + dims.query_base(dims.in.q, bh), dims.in.q.seq, i0, BR, HD, seq);
  stage(sdo, HD, dout + dims.query_base(dims.in.dout, bh), dims.in.dout.seq, i0, BR, HD, seq);
  const M* lse_b = lse + dims.query_base(dims.in.lse, bh);
  M acc[R][C], row_lse[R], row_delta[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = min64(i0 + warp * R + rr, seq - 1);
    row_lse[rr] = lse_b[i * dims.in.lse.seq];
    row_delta[rr] = delta[bh * seq + i];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[rr][c] = 0;
  }
  const int64_t last = min64(i0 + BR, seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    stage(sk, SP, kb, k_stride, j0, kTile, HD, seq);
    if constexpr (kTwoTransposed<T>) stage(sv, SP, vb, v_stride, j0, kTile, HD, seq);
    __syncthreads();
    const int64_t j = j0 + lane;
    M s[R], dp[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) s[rr] = dp[rr] = 0;
    for (int c = 0; c < HD; ++c) {
      const M kc = to_math(sk[lane * SP + c]);
      M vc;
      if constexpr (kTwoTransposed<T>)
        vc = to_math(sv[lane * SP + c]);
      else
        vc = j < seq ? to_math(vb[j * v_stride + c]) : M(0);
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        s[rr] = madd(to_math(sq[(warp * R + rr) * HD + c]), kc, s[rr]);
        dp[rr] = madd(to_math(sdo[(warp * R + rr) * HD + c]), vc, dp[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int64_t i = i0 + warp * R + rr;
      if (i >= seq || j0 > i) continue;  // the same for every lane of the warp
      const M p = j <= i ? exp(s[rr] * dims.scale - row_lse[rr]) : M(0);
      const M ds = i == 0 ? M(0) : p * (dp[rr] - row_delta[rr]);  // row 0: see the header
      const int keys = static_cast<int>(min64(kTile, i - j0 + 1));
      for (int jj = 0; jj < keys; ++jj) {
        const M dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
        for (int c = 0; c < C; ++c)
          acc[rr][c] = madd(dsj, to_math(sk[jj * SP + lane + 32 * c]), acc[rr][c]);
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    if (i >= seq) continue;
#pragma unroll
    for (int c = 0; c < C; ++c)
      dq[(bh * seq + i) * HD + lane + 32 * c] = from_math<T>(acc[rr][c] * dims.scale);
  }
}

template <typename T, int HD>
struct DkvShape {
  static constexpr int SP = padded<T>(HD);
  static constexpr int kFixed =
      static_cast<int>(sizeof(T)) * kTile * SP * (kTwoTransposed<T> ? 2 : 1) +
      2 * kTile * static_cast<int>(sizeof(math_of<T>));
  static constexpr int R = rows_per_warp<T>(HD, 2, kFixed);
  static constexpr int BC = kWarps * R;
};

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                const T* __restrict__ dout, const math_of<T>* __restrict__ lse,
                const math_of<T>* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                Dims<math_of<T>> dims) {
  using M = math_of<T>;
  using S = DkvShape<T, HD>;
  constexpr int C = HD / 32, R = S::R, BC = S::BC, SP = S::SP;
  __shared__ T sk[BC * HD];
  __shared__ T sv[BC * HD];
  __shared__ T sq[kTile * SP];
  __shared__ T sdo[kTwoTransposed<T> ? kTile * SP : 1];
  __shared__ M slse[kTile], sdelta[kTile];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t seq = dims.seq, kvh = blockIdx.y;
  const int64_t n = kvh / dims.kv_heads, g = kvh % dims.kv_heads;
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * BC;
  stage(sk, HD, k + dims.kv_base(dims.in.k, kvh), dims.in.k.seq, key0, BC, HD, seq);
  stage(sv, HD, v + dims.kv_base(dims.in.v, kvh), dims.in.v.seq, key0, BC, HD, seq);
  const int64_t q_stride = dims.in.q.seq, do_stride = dims.in.dout.seq;
  M ak[R][C], av[R][C];
#pragma unroll
  for (int rr = 0; rr < R; ++rr)
#pragma unroll
    for (int c = 0; c < C; ++c) ak[rr][c] = av[rr][c] = 0;
  for (int64_t hh = 0; hh < dims.group; ++hh) {
    const int64_t h = g * dims.group + hh, bh = n * dims.heads + h;
    const T* qb = q + dims.in.q.at(n, h, 0);
    const T* dob = dout + dims.in.dout.at(n, h, 0);
    const M* lse_b = lse + dims.in.lse.at(n, h, 0);
    for (int64_t i0 = key0 / kTile * kTile; i0 < seq; i0 += kTile) {
      __syncthreads();  // the previous tile is consumed (and sk, sv are staged)
      stage(sq, SP, qb, q_stride, i0, kTile, HD, seq);
      if constexpr (kTwoTransposed<T>) stage(sdo, SP, dob, do_stride, i0, kTile, HD, seq);
      if (threadIdx.x < kTile) {
        const int64_t i = min64(i0 + threadIdx.x, seq - 1);
        slse[threadIdx.x] = lse_b[i * dims.in.lse.seq];
        sdelta[threadIdx.x] = delta[bh * seq + i];
      }
      __syncthreads();
      const int64_t i = i0 + lane;
      M s[R], dp[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) s[rr] = dp[rr] = 0;
      for (int c = 0; c < HD; ++c) {
        const M qc = to_math(sq[lane * SP + c]);
        M dc;
        if constexpr (kTwoTransposed<T>)
          dc = to_math(sdo[lane * SP + c]);
        else
          dc = i < seq ? to_math(dob[i * do_stride + c]) : M(0);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          s[rr] = madd(qc, to_math(sk[(warp * R + rr) * HD + c]), s[rr]);
          dp[rr] = madd(dc, to_math(sv[(warp * R + rr) * HD + c]), dp[rr]);
        }
      }
      const int end = static_cast<int>(min64(kTile, seq - i0));
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const int64_t j = key0 + warp * R + rr;
        if (j >= seq || i0 + kTile <= j) continue;  // the same for every lane of the warp
        const bool seen = i >= j && i < seq;
        const M p = seen ? exp(s[rr] * dims.scale - slse[lane]) : M(0);
        const M ds = seen && i > 0 ? p * (dp[rr] - sdelta[lane]) : M(0);  // row 0: the header
        for (int ii = static_cast<int>(max64(0, j - i0)); ii < end; ++ii) {
          const M pi = __shfl_sync(0xffffffffu, p, ii);
          const M dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
          for (int c = 0; c < C; ++c) {
            const int x = lane + 32 * c;
            const T dov = kTwoTransposed<T> ? sdo[ii * SP + x] : dob[(i0 + ii) * do_stride + x];
            av[rr][c] = madd(pi, to_math(dov), av[rr][c]);
            ak[rr][c] = madd(dsi, to_math(sq[ii * SP + x]), ak[rr][c]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t j = key0 + warp * R + rr;
    if (j >= seq) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t e = (kvh * seq + j) * HD + lane + 32 * c;
      dk[e] = from_math<T>(ak[rr][c] * dims.scale);
      dv[e] = from_math<T>(av[rr][c]);
    }
  }
}

}  // namespace

// attention_backward_mma.cu: the tensor-core dq and dk/dv kernels of bf16 and f16.
template <typename T, int HD>
void launch_backward_mma(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in,
                         const float* delta);
// attention_any_head_dim.cu: head dims other than 64 and 128.
template <typename T>
void launch_backward_any(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in,
                         const math_of<T>* delta);

namespace {

// HD: 64 or 128 for the tiled kernels, 0 for any other head dim.
template <typename T, int HD>
void launch_backward(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in) {
  using M = math_of<T>;
  cudaStream_t stream = cuda_stream(ctx.device);
  const T* q = in_ptr<T>(ctx.inputs[0]);
  const T* k = in_ptr<T>(ctx.inputs[1]);
  const T* v = in_ptr<T>(ctx.inputs[2]);
  const T* o = in_ptr<T>(ctx.inputs[3]);
  const M* lse = in_ptr<M>(ctx.inputs[4]);
  const T* dout = in_ptr<T>(ctx.inputs[5]);
  // Before any launch: the tensor-core kernels' refusal leaves no work queued.
  if constexpr (HD != 0 && kHasMma<T>) check_vector_aligned(ctx, in);
  const int64_t rows = a.batch * a.heads * a.seq;
  Tensor delta = Tensor::empty({rows}, ctx.inputs[4].dtype(), ctx.inputs[0].device());
  const int64_t warp_blocks = std::min<int64_t>((rows + kWarps - 1) / kWarps, 1 << 20);
  const Dims<M> dims = attention_dims<M>(a, in);
  delta_kernel<T><<<static_cast<unsigned>(warp_blocks), kThreads, 0, stream>>>(
      o, dout, out_ptr<M>(delta), dims,
      ctx.inputs[3].is_contiguous() && ctx.inputs[5].is_contiguous(), rows,
      static_cast<int>(a.head_dim));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  if constexpr (HD == 0) {
    launch_backward_any<T>(ctx, a, in, in_ptr<M>(delta));
  } else if constexpr (kHasMma<T>) {
    launch_backward_mma<T, HD>(ctx, a, in, in_ptr<M>(delta));
  } else {
    const int64_t q_tiles = (a.seq + DqShape<T, HD>::BR - 1) / DqShape<T, HD>::BR;
    dq_kernel<T, HD>
        <<<dim3(static_cast<unsigned>(q_tiles), static_cast<unsigned>(a.batch * a.heads)), kThreads,
           0, stream>>>(q, k, v, dout, lse, in_ptr<M>(delta), out_ptr<T>(ctx.outputs[0]), dims);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    const int64_t k_tiles = (a.seq + DkvShape<T, HD>::BC - 1) / DkvShape<T, HD>::BC;
    dkdv_kernel<T, HD>
        <<<dim3(static_cast<unsigned>(k_tiles), static_cast<unsigned>(a.batch * a.kv_heads)),
           kThreads, 0, stream>>>(q, k, v, dout, lse, in_ptr<M>(delta), out_ptr<T>(ctx.outputs[1]),
                                  out_ptr<T>(ctx.outputs[2]), dims);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

}  // namespace

void causal_attention_backward_cuda(KernelContext& ctx) {
  const AttentionLayout& a = ctx.args<AttentionArgs>().layout;
  check_cuda_layout(ctx.op, a);
  const AttentionStrides in = attention_strides(ctx);
  if (cudnn_attention::backward(ctx, a)) return;  // QG_ATTENTION_BACKEND (attention_backend.h)
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (a.head_dim == 64)
      launch_backward<T, 64>(ctx, a, in);
    else if (a.head_dim == 128)
      launch_backward<T, 128>(ctx, a, in);
    else
      launch_backward<T, 0>(ctx, a, in);
  });
}

void add_attention_cuda_kernels(OpRegistry& r) {
  // Strided like the CPU kernels (attention_strides.h); the tensor-core kernels also need
  // 16-byte aligned rows (check_vector_aligned).
  r.get_mutable("causal_attention")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, causal_attention_cuda, /*strided=*/true});
  r.get_mutable("causal_attention_backward")
      .kernels.push_back(
          {DeviceType::cuda, kFloatDTypes, causal_attention_backward_cuda, /*strided=*/true});
}

}  // namespace qg
