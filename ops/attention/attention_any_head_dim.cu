// CUDA causal attention for head dims other than 64 and 128 (any even head dim up to 256,
// every float dtype): plain SIMT kernels in M, one warp per row and no shared memory, so
// they fit any head dim; slower than the tiled kernels (each q . k is one warp reduction),
// meant for small models and tests. Lane l owns dims l, l + 32, ... (at most 8 of them).
//   forward:  per query row, keys in order with the online softmax (scalar m and l).
//   dq:       per query row, keys j <= i: ds_ij = p_ij (do_i . v_j - D_i), dq += ds k_j.
//   dk, dv:   per key row, the query heads of its KV group in order and rows i >= j.
// ds_00 = 0 exactly, as in every backend (attention_backward.cu says why). D comes from
// attention_backward.cu's delta kernel.
#include <algorithm>

#include "core/graph.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_tiles.cuh"

namespace qg {
namespace {

using namespace cuda;
using namespace cuda::attention;

constexpr int kMaxDims = kMaxAnyHeadDim / 32;  // dims per lane

// sum_c a_c b_c over the hd dims of two rows, the same value in every lane.
template <typename T, typename M = math_of<T>>
__device__ __forceinline__ M warp_dot(const T* a, const T* b, int hd, int lane) {
  M s = 0;
  for (int c = lane; c < hd; c += 32) s = madd(to_math(a[c]), to_math(b[c]), s);
  return warp_sum(s);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_any_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ o, math_of<T>* __restrict__ lse, Dims<math_of<T>> dims,
                       int64_t rows, int hd) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    const int64_t bh = r / dims.seq, i = r % dims.seq;
    const T* qr = q + dims.query_row(dims.in.q, bh, i);
    const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
    const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);
    const int64_t ks = dims.in.k.seq, vs = dims.in.v.seq;
    M m = minus_infinity<M>(), l = 0, acc[kMaxDims];
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) acc[c] = 0;
    for (int64_t j = 0; j <= i; ++j) {
      const M s = warp_dot<T>(qr, kb + j * ks, hd, lane) * dims.scale;
      const M m_new = fmax(m, s);
      const M corr = exp(m - m_new), p = exp(s - m_new);
      l = l * corr + p;
      m = m_new;
#pragma unroll
      for (int c = 0; c < kMaxDims; ++c) {
        const int x = lane + 32 * c;
        if (x < hd) acc[c] = madd(p, to_math(vb[j * vs + x]), acc[c] * corr);
      }
    }
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) {
      const int x = lane + 32 * c;
      if (x < hd) o[r * hd + x] = from_math<T>(acc[c] / l);
    }
    if (lane == 0) lse[r] = m + log(l);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dq_any_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ dout, const math_of<T>* __restrict__ lse,
                  const math_of<T>* __restrict__ delta, T* __restrict__ dq, Dims<math_of<T>> dims,
                  int64_t rows, int hd) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    const int64_t bh = r / dims.seq, i = r % dims.seq;
    const T* qr = q + dims.query_row(dims.in.q, bh, i);
    const T* dor = dout + dims.query_row(dims.in.dout, bh, i);
    const M row_lse = lse[dims.query_row(dims.in.lse, bh, i)];
    const T* kb = k + dims.kv_base_of_query(dims.in.k, bh);
    const T* vb = v + dims.kv_base_of_query(dims.in.v, bh);
    const int64_t ks = dims.in.k.seq, vs = dims.in.v.seq;
    M acc[kMaxDims];
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) acc[c] = 0;
    for (int64_t j = 0; j <= i && i > 0; ++j) {  // row 0: ds_00 = 0, so dq_0 = 0
      const M p = exp(warp_dot<T>(qr, kb + j * ks, hd, lane) * dims.scale - row_lse);
      const M ds = p * (warp_dot<T>(dor, vb + j * vs, hd, lane) - delta[r]);
#pragma unroll
      for (int c = 0; c < kMaxDims; ++c) {
        const int x = lane + 32 * c;
        if (x < hd) acc[c] = madd(ds, to_math(kb[j * ks + x]), acc[c]);
      }
    }
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) {
      const int x = lane + 32 * c;
      if (x < hd) dq[r * hd + x] = from_math<T>(acc[c] * dims.scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dkdv_any_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const math_of<T>* __restrict__ lse,
                    const math_of<T>* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                    Dims<math_of<T>> dims, int64_t kv_rows, int hd) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps, seq = dims.seq;
  for (int64_t kr = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5); kr < kv_rows; kr += warps) {
    const int64_t kvh = kr / seq, j = kr % seq;
    const int64_t n = kvh / dims.kv_heads, g = kvh % dims.kv_heads;
    const T* kj = k + dims.in.k.at(n, g, j);
    const T* vj = v + dims.in.v.at(n, g, j);
    M ak[kMaxDims], av[kMaxDims];
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) ak[c] = av[c] = 0;
    for (int64_t hh = 0; hh < dims.group; ++hh) {
      const int64_t h = g * dims.group + hh, bh = n * dims.heads + h;
      for (int64_t i = j; i < seq; ++i) {
        const int64_t r = bh * seq + i;
        const T* qr = q + dims.in.q.at(n, h, i);
        const T* dor = dout + dims.in.dout.at(n, h, i);
        const M row_lse = lse[dims.in.lse.at(n, h, i)];
        const M p = exp(warp_dot<T>(qr, kj, hd, lane) * dims.scale - row_lse);
        const M ds = i == 0 ? M(0) : p * (warp_dot<T>(dor, vj, hd, lane) - delta[r]);
#pragma unroll
        for (int c = 0; c < kMaxDims; ++c) {
          const int x = lane + 32 * c;
          if (x < hd) {
            ak[c] = madd(ds, to_math(qr[x]), ak[c]);
            av[c] = madd(p, to_math(dor[x]), av[c]);
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kMaxDims; ++c) {
      const int x = lane + 32 * c;
      if (x < hd) {
        dk[kr * hd + x] = from_math<T>(ak[c] * dims.scale);
        dv[kr * hd + x] = from_math<T>(av[c]);
      }
    }
  }
}

// One warp per row, at most 2^20 blocks (the kernels loop over the rest).
unsigned warp_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>((rows + kWarps - 1) / kWarps, 1 << 20));
}

}  // namespace

template <typename T>
void launch_forward_any(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in) {
  using M = math_of<T>;
  const int64_t rows = a.batch * a.heads * a.seq;
  forward_any_kernel<T><<<warp_blocks(rows), kThreads, 0, cuda_stream(ctx.device)>>>(
      in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
      out_ptr<T>(ctx.outputs[0]), out_ptr<M>(ctx.outputs[1]), attention_dims<M>(a, in), rows,
      static_cast<int>(a.head_dim));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void launch_backward_any(KernelContext& ctx, const AttentionLayout& a, const AttentionStrides& in,
                         const math_of<T>* delta) {
  using M = math_of<T>;
  cudaStream_t stream = cuda_stream(ctx.device);
  const T* q = in_ptr<T>(ctx.inputs[0]);
  const T* k = in_ptr<T>(ctx.inputs[1]);
  const T* v = in_ptr<T>(ctx.inputs[2]);
  const M* lse = in_ptr<M>(ctx.inputs[4]);
  const T* dout = in_ptr<T>(ctx.inputs[5]);
  const Dims<M> dims = attention_dims<M>(a, in);
  const int hd = static_cast<int>(a.head_dim);
  const int64_t rows = a.batch * a.heads * a.seq, kv_rows = a.batch * a.kv_heads * a.seq;
  dq_any_kernel<T><<<warp_blocks(rows), kThreads, 0, stream>>>(
      q, k, v, dout, lse, delta, out_ptr<T>(ctx.outputs[0]), dims, rows, hd);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  dkdv_any_kernel<T><<<warp_blocks(kv_rows), kThreads, 0, stream>>>(
      q, k, v, dout, lse, delta, out_ptr<T>(ctx.outputs[1]), out_ptr<T>(ctx.outputs[2]), dims,
      kv_rows, hd);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

#define QG_ATTENTION_ANY(T)                                                    \
  template void launch_forward_any<T>(KernelContext&, const AttentionLayout&,  \
                                      const AttentionStrides&);                \
  template void launch_backward_any<T>(KernelContext&, const AttentionLayout&, \
                                       const AttentionStrides&, const math_of<T>*);
QG_ATTENTION_ANY(float)
QG_ATTENTION_ANY(double)
QG_ATTENTION_ANY(__half)
QG_ATTENTION_ANY(__nv_bfloat16)
#undef QG_ATTENTION_ANY

}  // namespace qg
