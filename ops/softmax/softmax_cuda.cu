// CUDA kernels for softmax and softmax_backward, in the CPU's math type (f32 for
// f32/f16/bf16, f64 for f64). Last axis: one warp per row up to kWarpRowMax elements (eight
// rows per block), else one block per row; other axes: one thread per (outer, inner) column,
// adjacent threads reading adjacent inner elements (coalesced). Every reduction has a fixed
// order (butterfly shuffles, the block tree of block_reduce), so results are deterministic;
// they differ from the CPU's sequential sums and libm's exp in the last bits, hence the
// crosscheck tolerance (runtime/crosscheck.cpp).
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
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

// Row reductions over one last-axis row: by a warp (lanes stride by 32) or a block.
template <bool kWarp, typename M, typename Load, typename C>
__device__ M row_reduce(int64_t len, M init, Load load, C combine) {
  const int lane = kWarp ? threadIdx.x % 32 : threadIdx.x;
  const int step = kWarp ? 32 : blockDim.x;
  M acc = init;
  for (int64_t j = lane; j < len; j += step) acc = combine(acc, load(j));
  if constexpr (kWarp) {
    if constexpr (std::is_same_v<C, MaxF<M>>)
      return warp_max(acc);
    else
      return warp_sum(acc);
  } else {
    return block_reduce(acc, combine);
  }
}

template <bool kWarp, typename T>
__global__ void softmax_rows_kernel(const T* x, T* y, int64_t rows, int64_t len) {
  using M = math_of<T>;
  const int64_t per_block = kWarp ? blockDim.x / 32 : 1;
  const int64_t first = blockIdx.x * per_block + (kWarp ? threadIdx.x / 32 : 0);
  const int lane = kWarp ? threadIdx.x % 32 : threadIdx.x;
  const int step = kWarp ? 32 : blockDim.x;
  for (int64_t r = first; r < rows; r += gridDim.x * per_block) {
    const T* row = x + r * len;
    auto load = [&](int64_t j) { return static_cast<M>(to_math(row[j])); };
    M mx = row_reduce<kWarp>(len, M(-INFINITY), load, MaxF<M>{});
    M sum = row_reduce<kWarp>(
        len, M(0), [&](int64_t j) { return exp_of(load(j) - mx); }, AddF<M>{});
    for (int64_t j = lane; j < len; j += step)
      y[r * len + j] = from_math<T>(exp_of(load(j) - mx) / sum);
  }
}

template <bool kWarp, typename T>
__global__ void softmax_backward_rows_kernel(const T* dy, const T* y, T* dx, int64_t rows,
                                             int64_t len) {
  using M = math_of<T>;
  const int64_t per_block = kWarp ? blockDim.x / 32 : 1;
  const int64_t first = blockIdx.x * per_block + (kWarp ? threadIdx.x / 32 : 0);
  const int lane = kWarp ? threadIdx.x % 32 : threadIdx.x;
  const int step = kWarp ? 32 : blockDim.x;
  for (int64_t r = first; r < rows; r += gridDim.x * per_block) {
    const int64_t base = r * len;
    M dot = row_reduce<kWarp>(
        len, M(0),
        [&](int64_t j) {
          return static_cast<M>(to_math(dy[base + j])) * static_cast<M>(to_math(y[base + j]));
        },
        AddF<M>{});
    for (int64_t j = lane; j < len; j += step) {
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

void softmax_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  SoftmaxColumns c = softmax_columns(ctx.op, ctx.attrs, x);
  const int64_t rows = c.outer * c.inner;
  if (rows == 0 || c.axis_len == 0) return;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (c.inner == 1 && c.axis_len <= kWarpRowMax) {
      softmax_rows_kernel<true, T>
          <<<capped_blocks((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, s>>>(
              in_ptr<T>(x), out_ptr<T>(y), rows, c.axis_len);
    } else if (c.inner == 1) {
      softmax_rows_kernel<false, T>
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
  SoftmaxColumns c = softmax_columns(ctx.op, ctx.attrs, dy);
  const int64_t rows = c.outer * c.inner;
  if (rows == 0 || c.axis_len == 0) return;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (c.inner == 1 && c.axis_len <= kWarpRowMax) {
      softmax_backward_rows_kernel<true, T>
          <<<capped_blocks((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, s>>>(
              in_ptr<T>(dy), in_ptr<T>(y), out_ptr<T>(dx), rows, c.axis_len);
    } else if (c.inner == 1) {
      softmax_backward_rows_kernel<false, T><<<capped_blocks(rows), kThreads, 0, s>>>(
          in_ptr<T>(dy), in_ptr<T>(y), out_ptr<T>(dx), rows, c.axis_len);
    } else {
      auto shape = elementwise_launch(rows);
      softmax_backward_columns_kernel<T>
          <<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(dy), in_ptr<T>(y), out_ptr<T>(dx), c);
    }
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

void add_softmax_cuda_kernels(OpRegistry& r) {
  r.get_mutable("softmax").kernels.push_back({DeviceType::cuda, kFloatTypes, softmax_cuda});
  r.get_mutable("softmax_backward")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, softmax_backward_cuda});
}

}  // namespace qg
