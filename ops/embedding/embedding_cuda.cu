// CUDA kernels for embedding and embedding_backward.
// Forward: one block per output row p reads indices[p] once and copies weight[indices[p], :]
// (bit-exact with the CPU's row copy). An index outside [0, V) is recorded in the device error
// buffer (the first failure wins) and raised as a qg::Error at the end of the run; its output
// row is zeros.
// Backward, deterministic without atomics on floats: (1) the positions 0..N-1 are radix-sorted
// by index (cub's LSD sort is stable, so equal indices keep ascending positions); (2) one block
// per dweight row v finds v's run of sorted positions by binary search, once, and its threads
// sum dy[p, d] over the run in ascending p, in the math type, as the CPU does: bit-identical
// results. (A search per element, 2 x log2(N) dependent loads for each of V x D elements, took
// 4.3 ms per call at V 32000, D 1024, N 8192 on an H200: 34 times the bytes' floor.)
// Rows whose width is a multiple of 8, in 16-byte aligned tensors, go in packs of 8 elements
// (16-byte loads and stores for 16-bit types) with the same per-element arithmetic: the
// language model's loss gathers its [8184, 32000] bf16 logits rows and scatters their
// gradient back, where 2-byte accesses left the two kernels at 2-3 times their bytes' time.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"

namespace qg {
namespace {

using namespace cuda;

// Rows are handed out grid-stride; a row's threads step through its columns.
constexpr int kRowThreads = 128;

int row_blocks(int64_t rows) {
  return static_cast<int>(std::min<int64_t>(rows, 65535 * 8));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kRowThreads)
    embedding_gather_kernel(const T* weight, const I* indices, T* y, int64_t n, int64_t width,
                            int64_t rows, DeviceErrorRecord* err, int32_t node) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int64_t v = static_cast<int64_t>(indices[p]);
    const bool ok = v >= 0 && v < rows;
    if (!ok && threadIdx.x == 0)
      report_device_error(err, kIndexOutOfRange, node, p, static_cast<double>(v), 0,
                          static_cast<double>(rows));
    T* out = y + p * width;
    const T* in = weight + (ok ? v : 0) * width;
    for (int64_t d = threadIdx.x; d < width; d += blockDim.x) out[d] = ok ? in[d] : T{};
  }
}

// The same gather in packs of 8 (width a multiple of 8, both tensors 16-byte aligned).
template <typename T, typename I>
__global__ void __launch_bounds__(kRowThreads)
    embedding_gather_packs_kernel(const T* weight, const I* indices, T* y, int64_t n, int64_t width,
                                  int64_t rows, DeviceErrorRecord* err, int32_t node) {
  const int64_t packs = width / 8;
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int64_t v = static_cast<int64_t>(indices[p]);
    const bool ok = v >= 0 && v < rows;
    if (!ok && threadIdx.x == 0)
      report_device_error(err, kIndexOutOfRange, node, p, static_cast<double>(v), 0,
                          static_cast<double>(rows));
    auto* out = reinterpret_cast<Pack8<T>*>(y + p * width);
    const auto* in = reinterpret_cast<const Pack8<T>*>(weight + (ok ? v : 0) * width);
    for (int64_t d = threadIdx.x; d < packs; d += blockDim.x) out[d] = ok ? in[d] : Pack8<T>{};
  }
}

bool packs_of_8(int64_t width, const void* a, const void* b) {
  return width % 8 == 0 && aligned16(a) && aligned16(b);
}

// Sort keys: the index, or `rows` (sorted past every valid row, so never summed) after
// recording an out-of-range index.
template <typename I>
__global__ void embedding_keys_kernel(const I* indices, int64_t n, int64_t rows, uint32_t* keys,
                                      int32_t* positions, DeviceErrorRecord* err, int32_t node) {
  for (int64_t p = global_thread(); p < n; p += global_stride()) {
    const int64_t v = static_cast<int64_t>(indices[p]);
    const bool ok = v >= 0 && v < rows;
    if (!ok)
      report_device_error(err, kIndexOutOfRange, node, p, static_cast<double>(v), 0,
                          static_cast<double>(rows));
    keys[p] = static_cast<uint32_t>(ok ? v : rows);
    positions[p] = static_cast<int32_t>(p);
  }
}

__device__ __forceinline__ int64_t lower_bound(const uint32_t* keys, int64_t n, uint32_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_row_sums_kernel(const T* dy, const uint32_t* keys, const int32_t* positions,
                              int64_t n, int64_t rows, int64_t width, T* dw) {
  using M = math_of<T>;
  __shared__ int64_t run[2];
  for (int64_t v = blockIdx.x; v < rows; v += gridDim.x) {
    if (threadIdx.x < 2)
      run[threadIdx.x] = lower_bound(keys, n, static_cast<uint32_t>(v + threadIdx.x));
    __syncthreads();
    const int64_t begin = run[0], end = run[1];
    __syncthreads();  // run[] is rewritten for the next row
    for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
      M acc = 0;
      for (int64_t j = begin; j < end; ++j) acc += to_math(dy[positions[j] * width + d]);
      dw[v * width + d] = from_math<T>(acc);
    }
  }
}

// The same sums in packs of 8 columns a thread (width a multiple of 8, 16-byte aligned).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    embedding_row_sums_packs_kernel(const T* dy, const uint32_t* keys, const int32_t* positions,
                                    int64_t n, int64_t rows, int64_t width, T* dw) {
  using M = math_of<T>;
  __shared__ int64_t run[2];
  const int64_t packs = width / 8;
  for (int64_t v = blockIdx.x; v < rows; v += gridDim.x) {
    if (threadIdx.x < 2)
      run[threadIdx.x] = lower_bound(keys, n, static_cast<uint32_t>(v + threadIdx.x));
    __syncthreads();
    const int64_t begin = run[0], end = run[1];
    __syncthreads();  // run[] is rewritten for the next row
    for (int64_t d = threadIdx.x; d < packs; d += blockDim.x) {
      M acc[8] = {};
      for (int64_t j = begin; j < end; ++j) {
        const Pack8<T> g = reinterpret_cast<const Pack8<T>*>(dy + positions[j] * width)[d];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += to_math(g.v[k]);
      }
      Pack8<T> r;
#pragma unroll
      for (int k = 0; k < 8; ++k) r.v[k] = from_math<T>(acc[k]);
      reinterpret_cast<Pack8<T>*>(dw + v * width)[d] = r;
    }
  }
}

template <typename Fn>
void dispatch_index(DType dtype, const std::string& op, Fn&& fn) {
  if (dtype == DType::i32) return fn(int32_t{});
  if (dtype == DType::i64) return fn(int64_t{});
  QG_FAIL(op, "indices must be i64 or i32, got ", dtype_name(dtype));
}

void embedding_cuda(KernelContext& ctx) {
  const Tensor& weight = ctx.inputs[0];
  const Tensor& indices = ctx.inputs[1];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  auto s = cuda_stream(ctx.device);
  dispatch_float(weight.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(indices.dtype(), ctx.op, [&](auto itag) {
      using I = decltype(itag);
      if (packs_of_8(weight.size(1), weight.raw_data(), y.raw_data()))
        embedding_gather_packs_kernel<T, I><<<row_blocks(indices.numel()), kRowThreads, 0, s>>>(
            in_ptr<T>(weight), in_ptr<I>(indices), out_ptr<T>(y), indices.numel(), weight.size(1),
            weight.size(0), error_record(ctx.device), ctx.site);
      else
        embedding_gather_kernel<T, I><<<row_blocks(indices.numel()), kRowThreads, 0, s>>>(
            in_ptr<T>(weight), in_ptr<I>(indices), out_ptr<T>(y), indices.numel(), weight.size(1),
            weight.size(0), error_record(ctx.device), ctx.site);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  });
}

void embedding_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& indices = ctx.inputs[1];
  Tensor& dw = ctx.outputs[0];
  const int64_t n = indices.numel(), rows = dw.size(0), width = dw.size(1);
  if (dw.numel() == 0 && n == 0) return;
  QG_CHECK(n <= INT32_MAX && rows < static_cast<int64_t>(UINT32_MAX), ctx.op,
           "the CUDA kernel takes at most 2^31 - 1 indices and 2^32 - 1 rows; got ", n,
           " indices and ", rows, " rows");
  auto s = cuda_stream(ctx.device);
  const Device dev = dy.device();
  Tensor keys = Tensor::empty({2 * n}, DType::i32, dev);
  Tensor positions = Tensor::empty({2 * n}, DType::i32, dev);
  auto* keys_in = static_cast<uint32_t*>(keys.raw_data());
  auto* pos_in = out_ptr<int32_t>(positions);
  uint32_t* keys_sorted = keys_in + n;
  int32_t* pos_sorted = pos_in + n;
  if (n > 0) {
    dispatch_index(indices.dtype(), ctx.op, [&](auto itag) {
      using I = decltype(itag);
      auto shape = elementwise_launch(n);
      embedding_keys_kernel<I><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<I>(indices), n, rows, keys_in, pos_in, error_record(ctx.device), ctx.site);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
    int end_bit = 1;
    while (end_bit < 32 && (uint64_t{1} << end_bit) <= static_cast<uint64_t>(rows)) ++end_bit;
    size_t temp_bytes = 0;
    const int count = static_cast<int>(n);
    QG_CUDA_CHECK(ctx.op,
                  cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_sorted, pos_in,
                                                  pos_sorted, count, 0, end_bit, s));
    Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes) + 1}, DType::u8, dev);
    QG_CUDA_CHECK(ctx.op,
                  cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_sorted,
                                                  pos_in, pos_sorted, count, 0, end_bit, s));
  }
  if (dw.numel() == 0) return;
  dispatch_float(dw.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (packs_of_8(width, dy.raw_data(), dw.raw_data()))
      embedding_row_sums_packs_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(
          in_ptr<T>(dy), keys_sorted, pos_sorted, n, rows, width, out_ptr<T>(dw));
    else
      embedding_row_sums_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(
          in_ptr<T>(dy), keys_sorted, pos_sorted, n, rows, width, out_ptr<T>(dw));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_embedding_cuda_kernels(OpRegistry& r) {
  r.get_mutable("embedding").kernels.push_back({DeviceType::cuda, kFloatDTypes, embedding_cuda});
  r.get_mutable("embedding_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, embedding_backward_cuda});
}

}  // namespace qg
