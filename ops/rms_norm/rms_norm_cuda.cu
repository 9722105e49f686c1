// CUDA kernels of rms_norm and rms_norm_backward, bit-identical to the CPU kernels: the same
// arithmetic (rms_norm_math.h) and the same order of every f64 sum.
//   forward, dx: one warp per row. Lane t sums elements t, t + 32, ... of the row; the xor
//                shuffles add the lane sums as rms_norm_math.h's halving tree (every lane
//                ends with the same bits); a second pass over the row, just read and still
//                in L1/L2, writes y (dx).
//   dweight:     per-chunk column sums (kRowsPerChunk rows each, in row order), then a fold
//                over the chunks in order: deterministic, no atomics.
// Every loop over a row (or a chunk's rows) is unrolled, so that the loads of several
// iterations can issue together; the f64 sums still add in the same order. (Measured on the
// Llama step: the backward went from 4.2x to 4.1x its bandwidth floor, so memory latency of
// these loops is not what holds it back; not yet known what is.)
#include <algorithm>
#include <type_traits>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/fused/norm_backward_add/norm_backward_add.h"
#include "ops/rms_norm/rms_norm_args.h"
#include "ops/rms_norm/rms_norm_math.h"

namespace qg {
namespace {

using namespace cuda;
using namespace rms_norm_math;

constexpr int kWarpsPerBlock = 4;
constexpr int kColumnThreads = 256;

__device__ __forceinline__ double warp_tree(double v) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

unsigned warp_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 1 << 20)));
}

// y's element: the T result, narrowed once more to O (out_dtype) as the cast kernel does.
template <typename O, typename T>
__device__ __forceinline__ O narrow(T v) {
  if constexpr (std::is_same_v<O, T>)
    return v;
  else
    return from_math<O>(static_cast<math_of<O>>(to_math(v)));
}

template <typename T, typename O>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ y,
                   math_of<T>* __restrict__ rstd, int64_t rows, int64_t dim, double eps) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const T* p = x + r * dim;
    double ss = 0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += kLanes) {
      const double v = static_cast<double>(to_math(p[j]));
      ss += v * v;
    }
    const M rs = inv_rms<M>(warp_tree(ss), dim, eps);
    if (lane == 0) rstd[r] = rs;
    O* out = y + r * dim;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += kLanes) {
      const T h = from_math<T>(to_math(p[j]) * rs);
      out[j] = narrow<O>(from_math<T>(to_math(w[j]) * to_math(h)));
    }
  }
}

// dx of each row; with a residual (fused_rms_norm_backward_add) the kernel writes
// out = T(residual + dx) instead, the add kernel's arithmetic on the same rounded dx, and with a
// narrow type N != T also narrow_out = N(out), the cast kernel's rounding of that sum.
template <typename T, bool kResidual, typename N>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    dx_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
              const math_of<T>* __restrict__ rstd, const T* __restrict__ residual,
              T* __restrict__ out, N* __restrict__ narrow_out, int64_t rows, int64_t dim) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const int64_t o = r * dim;
    double s = 0;
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += kLanes) {
      const M g = to_math(from_math<T>(to_math(dy[o + j]) * to_math(w[j])));
      s += static_cast<double>(g) * static_cast<double>(to_math(x[o + j]));
    }
    const M rs = rstd[r], k = dx_factor<M>(warp_tree(s), dim, rs);
#pragma unroll 4
    for (int64_t j = lane; j < dim; j += kLanes) {
      const M g = to_math(from_math<T>(to_math(dy[o + j]) * to_math(w[j])));
      T v = from_math<T>(rs * g - to_math(x[o + j]) * k);
      if constexpr (kResidual) v = from_math<T>(to_math(residual[o + j]) + to_math(v));
      out[o + j] = v;
      if constexpr (!std::is_same_v<N, T>)
        narrow_out[o + j] = from_math<N>(static_cast<math_of<N>>(to_math(v)));
    }
  }
}

// partial[c * dim + j]: the sum of dy * h over the rows of chunk c, in row order.
template <typename T>
__global__ void dweight_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                       const math_of<T>* __restrict__ rstd, int64_t rows,
                                       int64_t dim, int64_t chunks, double* __restrict__ partial) {
  const int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t r0 = c * kRowsPerChunk;
    const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
    double acc = 0;
#pragma unroll 8
    for (int64_t r = r0; r < r1; ++r) {
      const T h = from_math<T>(to_math(x[r * dim + j]) * rstd[r]);
      acc += static_cast<double>(to_math(dy[r * dim + j])) * static_cast<double>(to_math(h));
    }
    partial[c * dim + j] = acc;
  }
}

// dw[j] = partial[0][j] + partial[1][j] + ... in chunk order. A block folds kFoldColumns
// columns: its threads stage kFoldRows chunks of them at a time in shared memory (coalesced
// rows of partial), then one thread per column adds its column in order. (Before, a thread
// per column read its strided column from memory, a few loads in flight at a time, on 1024
// threads in all: by estimate, not yet measured, about 25 us of the Llama backward's 85.)
constexpr int kFoldColumns = 32;
constexpr int kFoldRows = 64;
constexpr int kFoldThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kFoldThreads)
    dweight_fold_kernel(const double* __restrict__ partial, int64_t chunks, int64_t dim,
                        T* __restrict__ dw) {
  using M = math_of<T>;
  __shared__ double tile[kFoldRows][kFoldColumns];
  const int col = threadIdx.x % kFoldColumns;
  const int64_t j0 = int64_t{blockIdx.x} * kFoldColumns, j = j0 + col;
  double s = 0;
  for (int64_t c0 = 0; c0 < chunks; c0 += kFoldRows) {
    const int rows = static_cast<int>(chunks - c0 < kFoldRows ? chunks - c0 : kFoldRows);
    for (int r = threadIdx.x / kFoldColumns; r < rows; r += kFoldThreads / kFoldColumns)
      tile[r][col] = j < dim ? partial[(c0 + r) * dim + j] : 0.0;
    __syncthreads();
    if (threadIdx.x < kFoldColumns)
      for (int r = 0; r < rows; ++r) s += tile[r][threadIdx.x];
    __syncthreads();  // the next chunks overwrite the tile
  }
  if (threadIdx.x < kFoldColumns && j < dim) dw[j] = from_math<T>(static_cast<M>(s));
}

void rms_norm_cuda(KernelContext& ctx) {
  const RmsNormArgs& a = ctx.args<RmsNormArgs>();
  if (a.rows == 0) return;
  cudaStream_t stream = cuda_stream(ctx.device);
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto otag) {
      using O = decltype(otag);
      forward_kernel<T, O><<<warp_blocks(a.rows), kWarpsPerBlock * 32, 0, stream>>>(
          in_ptr<T>(ctx.inputs[0]), in_ptr<T>(ctx.inputs[1]), out_ptr<O>(ctx.outputs[0]),
          out_ptr<math_of<T>>(ctx.outputs[1]), a.rows, a.dim, a.eps);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    };
    // out_dtype narrows an f32 x only (parse_args refuses the rest).
    if constexpr (std::is_same_v<T, float>) {
      if (a.out == DType::bf16) return launch(__nv_bfloat16{});
      if (a.out == DType::f16) return launch(__half{});
    }
    launch(T{});
  });
}

// rms_norm_backward, or (residual given) the fused backward + add [+ cast]: the dx kernel,
// then dweight's chunk sums and their fold. out: dx, or the sum; narrow: the cast's output.
void launch_backward(KernelContext& ctx, const RmsNormArgs& a, const Tensor* residual, Tensor& out,
                     Tensor& dweight, Tensor* narrow) {
  cudaStream_t stream = cuda_stream(ctx.device);
  if (a.rows == 0) {
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(dweight.raw_data(), 0, dweight.nbytes(), stream));
    return;
  }
  dispatch_float(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_of<T>;
    const T* dy = in_ptr<T>(ctx.inputs[0]);
    const T* x = in_ptr<T>(ctx.inputs[1]);
    const M* rstd = in_ptr<M>(ctx.inputs[3]);
    auto dx = [&](auto residual_tag, auto narrow_tag) {
      using N = decltype(narrow_tag);
      constexpr bool kResidual = decltype(residual_tag)::value;
      dx_kernel<T, kResidual, N><<<warp_blocks(a.rows), kWarpsPerBlock * 32, 0, stream>>>(
          dy, x, in_ptr<T>(ctx.inputs[2]), rstd, kResidual ? in_ptr<T>(*residual) : nullptr,
          out_ptr<T>(out), narrow != nullptr ? out_ptr<N>(*narrow) : nullptr, a.rows, a.dim);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    };
    if (residual == nullptr) {
      dx(std::false_type{}, T{});
    } else if (narrow == nullptr) {
      dx(std::true_type{}, T{});
    } else if constexpr (std::is_same_v<T, float>) {
      if (narrow->dtype() == DType::bf16)
        dx(std::true_type{}, __nv_bfloat16{});
      else if (narrow->dtype() == DType::f16)
        dx(std::true_type{}, __half{});
      else
        QG_FAIL(ctx.op, "no kernel for a ", dtype_name(narrow->dtype()), " copy of the sum");
    } else {
      QG_FAIL(ctx.op, "no kernel for a narrow copy of a ", dtype_name(out.dtype()), " sum");
    }
    const int64_t chunks = (a.rows + kRowsPerChunk - 1) / kRowsPerChunk;
    Tensor partial = Tensor::empty({chunks * a.dim}, DType::f64, ctx.inputs[0].device());
    dim3 grid(static_cast<unsigned>((a.dim + kColumnThreads - 1) / kColumnThreads),
              static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
    dweight_partial_kernel<T><<<grid, kColumnThreads, 0, stream>>>(
        dy, x, rstd, a.rows, a.dim, chunks, out_ptr<double>(partial));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    const auto fold_blocks = static_cast<unsigned>((a.dim + kFoldColumns - 1) / kFoldColumns);
    dweight_fold_kernel<T><<<fold_blocks, kFoldThreads, 0, stream>>>(
        in_ptr<double>(partial), chunks, a.dim, out_ptr<T>(dweight));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void rms_norm_backward_cuda(KernelContext& ctx) {
  launch_backward(ctx, ctx.args<RmsNormArgs>(), nullptr, ctx.outputs[0], ctx.outputs[1], nullptr);
}

void fused_norm_backward_add_cuda(KernelContext& ctx) {
  check_fused_norm_backward_add_inputs(ctx);
  // The row layout is the rms_norm_backward part's (the fused node parses no arguments).
  launch_backward(ctx, ctx.part(0).args<RmsNormArgs>(), &ctx.inputs[4], ctx.outputs[0],
                  ctx.outputs[1], ctx.outputs.size() == 3 ? &ctx.outputs[2] : nullptr);
}

}  // namespace

// The fused ops' kernels (ops/fused/norm_backward_add): this file's backward kernels.
void add_fused_norm_backward_add_cuda_kernels(OpRegistry& r) {
  for (const char* op : {"fused_rms_norm_backward_add", "fused_rms_norm_backward_add_cast"})
    r.get_mutable(op).kernels.push_back(
        {DeviceType::cuda, kFloatDTypes, fused_norm_backward_add_cuda});
}

void add_rms_norm_cuda_kernels(OpRegistry& r) {
  r.get_mutable("rms_norm").kernels.push_back({DeviceType::cuda, kFloatDTypes, rms_norm_cuda});
  r.get_mutable("rms_norm_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, rms_norm_backward_cuda});
}

}  // namespace qg
