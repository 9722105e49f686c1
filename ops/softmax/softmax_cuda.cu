// CUDA kernels for softmax and softmax_backward, and the single-pass kernels of their fused
// forms with a scale (fused_scaled_softmax(_backward), ops/fused), in the CPU's math type
// (f32 for f32/f16/bf16, f64 for f64). Last axis: one warp per row up to kWarpRowMax
// elements (eight rows per block, the row in registers), else one block per row; other axes: one
// thread per (outer, inner) column, adjacent threads reading adjacent inner elements (coalesced).
// Every reduction has a fixed order (butterfly shuffles, the block tree of block_reduce), so
// results are deterministic; they differ from the CPU's sequential sums and libm's exp in the last
// bits, hence the crosscheck tolerance (runtime/crosscheck.cpp).
#include <type_traits>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/fused/scaled_softmax/scaled_softmax.h"
#include "ops/softmax/softmax_columns.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;
constexpr int kWarpRowMax = 1024;

// The CPU's selection: a NaN on the right is ignored (the column still ends up NaN through
// its sum).
template <typename M>
__device__ __forceinline__ M max_of(M a, M b) {
  return b > a ? b : a;
}

template <typename M>
__device__ __forceinline__ M exp_of(M v) {
  if constexpr (std::is_same_v<M, double>) {
    return exp(v);
  } else {
    return expf(v);
  }
}

template <typename M>
__device__ __forceinline__ M warp_max(M v) {
  for (int off = 16; off > 0; off /= 2) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
template <typename M>
__device__ __forceinline__ M warp_sum(M v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename M>
struct MaxF {
  __device__ M operator()(M a, M b) const { return max_of(a, b); }
};
template <typename M>
struct AddF {
  __device__ M operator()(M a, M b) const { return a + b; }
};

// The scale of fused_scaled_softmax(_backward), applied to a math-type value v: the mul
// kernel's element expression with the scale second, from_math<T>(v * s)
// (ops/arith/arith_cuda.cu), read back into the math type as the next kernel would read
// it. The build's --fmad=false keeps the product its own rounding (never contracted into
// the softmax's x - max), so this is the unfused mul's value bit for bit.
template <typename T>
__device__ __forceinline__ math_of<T> scaled(math_of<T> v, math_of<T> s) {
  return static_cast<math_of<T>>(to_math(from_math<T>(v * s)));
}

// Rows of up to kWarpRowMax elements: one warp per row, the row held in registers (K
// elements per lane, K = 32 covers 1024), so x is read once and y written once (dy and y
// read once in the backward). Lane l holds elements l, l + 32, l + 64, ... (coalesced
// scalar loads) and folds them in that order before the butterfly: the order of a
// warp-strided loop over the row. (16-byte vector loads would hand a lane four adjacent
// elements and so change the sum's order, and with it the bits.)
// kScaled: the fused forms; x's elements (the backward's results) pass through scaled().
template <int K, bool kScaled, typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_warp_rows_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                             T* __restrict__ y, int64_t rows, int len) {
  using M = math_of<T>;
  constexpr int kRowsPerBlock = kThreads / 32;
  const int lane = threadIdx.x % 32;
  const M s = kScaled ? static_cast<M>(to_math(*scale)) : M(1);
  for (int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32; r < rows;
       r += int64_t{gridDim.x} * kRowsPerBlock) {
    // Offset by the lane so every access below is a constant offset (32 * k) from one base.
    const T* in = x + r * len + lane;
    T* out = y + r * len + lane;
    M v[K];
    M mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      v[k] = -INFINITY;  // padding past the row's end, see below
      if (j < len) {
        v[k] = static_cast<M>(to_math(in[32 * k]));
        if constexpr (kScaled) v[k] = scaled<T>(v[k], s);
      }
      mx = max_of(mx, v[k]);
    }
    mx = warp_max(mx);
    // Padding changes no bit: max_of(mx, -inf) keeps mx; exp(-inf - mx) is +0 for every mx
    // but -inf (then every real element is -inf too and the sum NaN already), and a lane's
    // sum (+0 or positive or NaN, it starts at +0) plus +0 is itself. So exp and the division
    // run unconditionally (no branch per element) and only the stores are predicated.
    M sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      v[k] = exp_of(v[k] - mx);
      sum += v[k];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      const T out_v = from_math<T>(v[k] / sum);
      if (j < len) out[32 * k] = out_v;
    }
  }
}

// dx = y * (dy - sum(dy * y)) (then RN(dx * scale) when kScaled), the row in registers as
// in the forward; the dot product in the same per-lane order as before.
template <int K, bool kScaled, typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_warp_rows_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                      const T* __restrict__ scale, T* __restrict__ dx, int64_t rows,
                                      int len) {
  using M = math_of<T>;
  constexpr int kRowsPerBlock = kThreads / 32;
  const int lane = threadIdx.x % 32;
  const M s = kScaled ? static_cast<M>(to_math(*scale)) : M(1);
  for (int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32; r < rows;
       r += int64_t{gridDim.x} * kRowsPerBlock) {
    const int64_t base = r * len + lane;  // as in the forward: constant offsets from here
    M g[K], v[K];
    M dot = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      // Padding past the row's end: +0 * +0 adds +0, which changes no lane's sum (it starts
      // at +0, so it is never -0).
      g[k] = 0;
      v[k] = 0;
      if (j < len) {
        g[k] = static_cast<M>(to_math(dy[base + 32 * k]));
        v[k] = static_cast<M>(to_math(y[base + 32 * k]));
      }
      dot += g[k] * v[k];
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      M d = v[k] * (g[k] - dot);
      if constexpr (kScaled) d = static_cast<M>(to_math(from_math<T>(d))) * s;
      const T out_v = from_math<T>(d);
      if (j < len) dx[base + 32 * k] = out_v;
    }
  }
}

// Calls f(std::integral_constant<int, K>) with the smallest K of 1, 2, 4, ..., 32 such that
// 32 * K covers `len` (at most kWarpRowMax).
template <typename F>
void with_lane_elements(int64_t len, F f) {
  if (len <= 32) return f(std::integral_constant<int, 1>{});
  if (len <= 64) return f(std::integral_constant<int, 2>{});
  if (len <= 128) return f(std::integral_constant<int, 4>{});
  if (len <= 256) return f(std::integral_constant<int, 8>{});
  if (len <= 512) return f(std::integral_constant<int, 16>{});
  f(std::integral_constant<int, 32>{});
}

// Rows longer than kWarpRowMax: one block per row, each pass a strided loop and a block tree.
template <typename M, typename Load, typename C>
__device__ M block_row_reduce(int64_t len, M init, Load load, C combine) {
  M acc = init;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) acc = combine(acc, load(j));
  return block_reduce(acc, combine);
}

template <typename T>
__global__ void softmax_block_rows_kernel(const T* x, T* y, int64_t rows, int64_t len) {
  using M = math_of<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * len;
    auto load = [&](int64_t j) { return static_cast<M>(to_math(row[j])); };
    M mx = block_row_reduce(len, M(-INFINITY), load, MaxF<M>{});
    M sum = block_row_reduce(
        len, M(0), [&](int64_t j) { return exp_of(load(j) - mx); }, AddF<M>{});
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
      y[r * len + j] = from_math<T>(exp_of(load(j) - mx) / sum);
  }
}

template <typename T>
__global__ void softmax_backward_block_rows_kernel(const T* dy, const T* y, T* dx, int64_t rows,
                                                   int64_t len) {
  using M = math_of<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * len;
    M dot = block_row_reduce(
        len, M(0),
        [&](int64_t j) {
          return static_cast<M>(to_math(dy[base + j])) * static_cast<M>(to_math(y[base + j]));
        },
        AddF<M>{});
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      M g = static_cast<M>(to_math(dy[base + j])), v = static_cast<M>(to_math(y[base + j]));
      dx[base + j] = from_math<T>(v * (g - dot));
    }
  }
}

// Softmax along a non-last axis: one thread per column, the CPU's sequential order.
template <typename T>
__global__ void softmax_columns_kernel(const T* x, T* y, SoftmaxColumns c) {
  using M = math_of<T>;
  for (int64_t k = global_thread(); k < c.outer * c.inner; k += global_stride()) {
    const int64_t base = (k / c.inner) * c.axis_len * c.inner + k % c.inner;
    M mx = -INFINITY;
    for (int64_t a = 0; a < c.axis_len; ++a)
      mx = max_of(mx, static_cast<M>(to_math(x[base + a * c.inner])));
    M sum = 0;
    for (int64_t a = 0; a < c.axis_len; ++a)
      sum += exp_of(static_cast<M>(to_math(x[base + a * c.inner])) - mx);
    for (int64_t a = 0; a < c.axis_len; ++a) {
      const int64_t i = base + a * c.inner;
      y[i] = from_math<T>(exp_of(static_cast<M>(to_math(x[i])) - mx) / sum);
    }
  }
}

template <typename T>
__global__ void softmax_backward_columns_kernel(const T* dy, const T* y, T* dx, SoftmaxColumns c) {
  using M = math_of<T>;
  for (int64_t k = global_thread(); k < c.outer * c.inner; k += global_stride()) {
    const int64_t base = (k / c.inner) * c.axis_len * c.inner + k % c.inner;
    M dot = 0;
    for (int64_t a = 0; a < c.axis_len; ++a) {
      const int64_t i = base + a * c.inner;
      dot += static_cast<M>(to_math(dy[i])) * static_cast<M>(to_math(y[i]));
    }
    for (int64_t a = 0; a < c.axis_len; ++a) {
      const int64_t i = base + a * c.inner;
      dx[i] = from_math<T>(static_cast<M>(to_math(y[i])) * (static_cast<M>(to_math(dy[i])) - dot));
    }
  }
}

unsigned capped_blocks(int64_t blocks) {
  int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 32;
  return static_cast<unsigned>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

unsigned warp_row_blocks(int64_t rows) {
  return capped_blocks((rows + kThreads / 32 - 1) / (kThreads / 32));
}

// y = softmax(x) (kScaled: softmax(RN(x * scale))) along the last axis by warp rows.
template <bool kScaled, typename T>
void launch_warp_rows(const T* x, const T* scale, T* y, int64_t rows, int64_t len, cudaStream_t s) {
  with_lane_elements(len, [&](auto k) {
    softmax_warp_rows_kernel<decltype(k)::value, kScaled, T>
        <<<warp_row_blocks(rows), kThreads, 0, s>>>(x, scale, y, rows, static_cast<int>(len));
  });
}

template <bool kScaled, typename T>
void launch_backward_warp_rows(const T* dy, const T* y, const T* scale, T* dx, int64_t rows,
                               int64_t len, cudaStream_t s) {
  with_lane_elements(len, [&](auto k) {
    softmax_backward_warp_rows_kernel<decltype(k)::value, kScaled, T>
        <<<warp_row_blocks(rows), kThreads, 0, s>>>(dy, y, scale, dx, rows, static_cast<int>(len));
  });
}

void softmax_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
  const int64_t rows = c.outer * c.inner;
  if (rows == 0 || c.axis_len == 0) return;
  auto s = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (c.inner == 1 && c.axis_len <= kWarpRowMax) {
      launch_warp_rows<false, T>(in_ptr<T>(x), nullptr, out_ptr<T>(y), rows, c.axis_len, s);
    } else if (c.inner == 1) {
      softmax_block_rows_kernel<T>
          <<<capped_blocks(rows), kThreads, 0, s>>>(in_ptr<T>(x), out_ptr<T>(y), rows, c.axis_len);
    } else {
      auto shape = elementwise_launch(rows);
      softmax_columns_kernel<T>
          <<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(x), out_ptr<T>(y), c);
    }
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void softmax_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& y = ctx.inputs[1];
  Tensor& dx = ctx.outputs[0];
  const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
  const int64_t rows = c.outer * c.inner;
  if (rows == 0 || c.axis_len == 0) return;
  auto s = cuda_stream(ctx.device);
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (c.inner == 1 && c.axis_len <= kWarpRowMax) {
      launch_backward_warp_rows<false, T>(in_ptr<T>(dy), in_ptr<T>(y), nullptr, out_ptr<T>(dx),
                                          rows, c.axis_len, s);
    } else if (c.inner == 1) {
      softmax_backward_block_rows_kernel<T><<<capped_blocks(rows), kThreads, 0, s>>>(
          in_ptr<T>(dy), in_ptr<T>(y), out_ptr<T>(dx), rows, c.axis_len);
    } else {
      auto shape = elementwise_launch(rows);
      softmax_backward_columns_kernel<T>
          <<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(dy), in_ptr<T>(y), out_ptr<T>(dx), c);
    }
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

// The fused forms in one pass where the rows are warp rows and the scale is the mul's second
// operand (attention's mul(scores, scale)); otherwise the original kernels back to back
// (same bits; a scale first keeps mul(s, x)'s operand order, which decides a NaN's payload).
bool single_pass(const KernelContext& ctx, const SoftmaxColumns& c) {
  return !ctx.args<SoftmaxArgs>().scale_first && c.inner == 1 && c.axis_len <= kWarpRowMax;
}

void fused_scaled_softmax_cuda(KernelContext& ctx) {
  check_fused_scaled_softmax_inputs(ctx);
  const Tensor& x = ctx.inputs[0];
  const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
  if (!single_pass(ctx, c)) return run_scaled_softmax_composed(ctx, DeviceType::cuda);
  const int64_t rows = c.outer;
  if (rows == 0 || c.axis_len == 0) return;
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch_warp_rows<true, T>(in_ptr<T>(x), in_ptr<T>(ctx.inputs[1]), out_ptr<T>(ctx.outputs[0]),
                              rows, c.axis_len, cuda_stream(ctx.device));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void fused_scaled_softmax_backward_cuda(KernelContext& ctx) {
  check_fused_scaled_softmax_inputs(ctx);
  const Tensor& dy = ctx.inputs[0];
  const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
  if (!single_pass(ctx, c)) return run_scaled_softmax_backward_composed(ctx, DeviceType::cuda);
  const int64_t rows = c.outer;
  if (rows == 0 || c.axis_len == 0) return;
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch_backward_warp_rows<true, T>(in_ptr<T>(dy), in_ptr<T>(ctx.inputs[1]),
                                       in_ptr<T>(ctx.inputs[2]), out_ptr<T>(ctx.outputs[0]), rows,
                                       c.axis_len, cuda_stream(ctx.device));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_softmax_cuda_kernels(OpRegistry& r) {
  r.get_mutable("softmax").kernels.push_back({DeviceType::cuda, kFloatDTypes, softmax_cuda});
  r.get_mutable("softmax_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, softmax_backward_cuda});
}

// Registered by the fused family, which defines these ops.
void add_fused_scaled_softmax_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_scaled_softmax")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, fused_scaled_softmax_cuda});
  r.get_mutable("fused_scaled_softmax_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, fused_scaled_softmax_backward_cuda});
}

}  // namespace qg
