// CUDA kernels for softmax_cross_entropy and its backward: one block per row (max, then the
// sum of exp, both deterministic block reductions), the per-row losses summed by a single
// block in a fixed order. A label outside [0, C) is recorded in the device error buffer and
// raised at the end of the run, as the CPU kernel raises it.
//
// Precision (docs/LLM_NUMERICS.md): the row max and every difference x - max are exact in the
// logits' math type; for f32, f16 and bf16 logits each exponential is f32's expf (within 2 ulp)
// of that exact difference, summed in f64, and the log-sum-exp and the loss are formed in f64;
// f64 logits keep f64 throughout. The CPU evaluates every exponential in f64, so the two agree
// to rounding (the crosscheck compares both outputs at their dtype's tolerance), not bit for
// bit. f64 exponentials were ~25 double-precision instructions an element, and double
// precision issues at half f32's rate: on the 207M Llama step (8 x 1024 tokens, a 32000-word
// vocabulary) the forward and backward took 2.8 ms against ~0.35 ms of memory traffic.
//
// A row of f32, f16 or bf16 logits whose length is a multiple of 8 (16-byte aligned) and at
// most kCachedThreads * kCachedPacks * 8 elements (32768: a 32k vocabulary fits) is read from
// memory once: each thread keeps its packs of 8 in registers for the max, the sum and (backward)
// the output. Other rows stream through the loop kernels, which read a row two (forward) or
// three (backward) times.
#include <type_traits>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/loss/loss_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

// std::max's selection (a NaN operand on the right is ignored), as the CPU row max uses.
struct MaxOp {
  template <typename V>
  __device__ V operator()(V a, V b) const {
    return a < b ? b : a;
  }
};

// The type each exponential is evaluated in: f32 for f32/f16/bf16 logits, f64 for f64.
template <typename T>
using exp_t = math_of<T>;

__device__ __forceinline__ float exp_of(float d) {
  return expf(d);
}
__device__ __forceinline__ double exp_of(double d) {
  return exp(d);
}

// The row's max and its log-sum-exp, computed by the whole block: the max and each x - max in
// the math type (exact), the exponentials in exp_t<T>, their sum and the log in f64.
template <typename T>
struct RowStats {
  exp_t<T> max;
  double lse;
};

template <typename T>
__device__ RowStats<T> row_stats(const T* row, int64_t c) {
  using E = exp_t<T>;
  E mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    mx = MaxOp{}(mx, static_cast<E>(to_math(row[j])));
  mx = block_reduce(mx, MaxOp{});
  double s = 0;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    s += static_cast<double>(exp_of(static_cast<E>(to_math(row[j])) - mx));
  s = block_reduce(s, SumOp{});
  return {mx, static_cast<double>(mx) + log(s)};
}

// The label of row i, or -1 after recording the error (the row is then skipped).
template <typename L>
__device__ int64_t checked_label(const L* labels, int64_t i, int64_t c, DeviceErrorRecord* err,
                                 int32_t node) {
  int64_t y = static_cast<int64_t>(labels[i]);
  if (y < 0 || y >= c) {
    if (threadIdx.x == 0)
      report_device_error(err, kLabelOutOfRange, node, i, static_cast<double>(y), 0,
                          static_cast<double>(c));
    return -1;
  }
  return y;
}

template <typename T, typename L>
__global__ void ce_rows_kernel(const T* logits, const L* labels, int64_t n, int64_t c,
                               double* row_loss, DeviceErrorRecord* err, int32_t node) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = logits + i * c;
    const double lse = row_stats(row, c).lse;
    int64_t y = checked_label(labels, i, c, err, node);
    if (threadIdx.x == 0) row_loss[i] = y < 0 ? 0.0 : lse - static_cast<double>(to_math(row[y]));
  }
}

template <typename L>
__global__ void ce_total_kernel(const double* row_loss, int64_t n, bool mean, L* out) {
  // Each thread sums a contiguous stretch of rows, then the block combines the stretches.
  int64_t per = (n + blockDim.x - 1) / blockDim.x;
  int64_t lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
  double acc = 0;
  for (int64_t i = lo; i < hi; ++i) acc += row_loss[i];
  double total = block_reduce(acc, SumOp{});
  if (threadIdx.x == 0) {
    if (mean) total /= static_cast<double>(n);
    out[0] = static_cast<L>(total);
  }
}

template <typename T, typename L>
__global__ void ce_backward_kernel(const T* logits, const L* labels,
                                   const cross_entropy_loss_t<T>* dloss, int64_t n, int64_t c,
                                   bool mean, T* out, DeviceErrorRecord* err, int32_t node) {
  using E = exp_t<T>;
  const double g = static_cast<double>(dloss[0]) / (mean ? static_cast<double>(n) : 1.0);
  const E ge = static_cast<E>(g);
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = logits + i * c;
    const RowStats<T> st = row_stats(row, c);
    // p = exp(x - lse) = exp((x - max) - log(sum)): x - max exact, log(sum) rounded once.
    const E log_sum = static_cast<E>(st.lse - static_cast<double>(st.max));
    int64_t y = checked_label(labels, i, c, err, node);
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const E p = exp_of((static_cast<E>(to_math(row[j])) - st.max) - log_sum);
      out[i * c + j] = from_math<T>(static_cast<math_of<T>>((p - (j == y ? E(1) : E(0))) * ge));
    }
  }
}

constexpr int kCachedThreads = 512;
constexpr int kCachedPacks = 8;

// Whether rows of c elements at `p` (and the output at `q`) take the register-cached kernels.
template <typename T>
bool cached_rows(int64_t c, const void* p, const void* q = nullptr) {
  return !std::is_same_v<T, double> && c % 8 == 0 && c > 0 &&
         c / 8 <= int64_t{kCachedThreads} * kCachedPacks && aligned16(p) &&
         (q == nullptr || aligned16(q));
}

// One row's packs in registers: thread t holds packs t, t + kCachedThreads, ... (of c / 8).
template <typename T>
struct CachedRow {
  Pack8<T> v[kCachedPacks];
  int count = 0;  // packs this thread holds

  __device__ void load(const T* row, int64_t c) {
    const auto* packs = reinterpret_cast<const Pack8<T>*>(row);
    const int64_t n = c / 8;
#pragma unroll
    for (int k = 0; k < kCachedPacks; ++k) {
      const int64_t p = threadIdx.x + int64_t{k} * kCachedThreads;
      if (p < n) {
        v[k] = packs[p];
        count = k + 1;
      }
    }
  }

  // The row's max and log-sum-exp, as row_stats computes them (in another order of the sum).
  __device__ RowStats<T> stats() const {
    using E = exp_t<T>;
    E mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kCachedPacks; ++k)
      if (k < count)
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = MaxOp{}(mx, static_cast<E>(to_math(v[k].v[j])));
    mx = block_reduce(mx, MaxOp{});
    double s = 0;
#pragma unroll
    for (int k = 0; k < kCachedPacks; ++k)
      if (k < count)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          s += static_cast<double>(exp_of(static_cast<E>(to_math(v[k].v[j])) - mx));
    s = block_reduce(s, SumOp{});
    return {mx, static_cast<double>(mx) + log(s)};
  }
};

template <typename T, typename L>
__global__ void __launch_bounds__(kCachedThreads)
    ce_rows_cached_kernel(const T* logits, const L* labels, int64_t n, int64_t c, double* row_loss,
                          DeviceErrorRecord* err, int32_t node) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    CachedRow<T> row;
    row.load(logits + i * c, c);
    const double lse = row.stats().lse;
    int64_t y = checked_label(labels, i, c, err, node);
    if (threadIdx.x == 0)
      row_loss[i] = y < 0 ? 0.0 : lse - static_cast<double>(to_math(logits[i * c + y]));
  }
}

template <typename T, typename L>
__global__ void __launch_bounds__(kCachedThreads)
    ce_backward_cached_kernel(const T* logits, const L* labels,
                              const cross_entropy_loss_t<T>* dloss, int64_t n, int64_t c, bool mean,
                              T* out, DeviceErrorRecord* err, int32_t node) {
  using E = exp_t<T>;
  const double g = static_cast<double>(dloss[0]) / (mean ? static_cast<double>(n) : 1.0);
  const E ge = static_cast<E>(g);
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    CachedRow<T> row;
    row.load(logits + i * c, c);
    const RowStats<T> st = row.stats();
    const E log_sum = static_cast<E>(st.lse - static_cast<double>(st.max));
    const int64_t y = checked_label(labels, i, c, err, node);
    auto* dst = reinterpret_cast<Pack8<T>*>(out + i * c);
#pragma unroll
    for (int k = 0; k < kCachedPacks; ++k)
      if (k < row.count) {
        const int64_t p = threadIdx.x + int64_t{k} * kCachedThreads;
        Pack8<T> r;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const E e = exp_of((static_cast<E>(to_math(row.v[k].v[j])) - st.max) - log_sum);
          const E hot = p * 8 + j == y ? E(1) : E(0);
          r.v[j] = from_math<T>(static_cast<math_of<T>>((e - hot) * ge));
        }
        dst[p] = r;
      }
  }
}

unsigned cached_blocks(int64_t n) {
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 8;
  return static_cast<unsigned>(n < cap ? (n > 0 ? n : 1) : cap);
}

unsigned row_blocks(int64_t n) {
  int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 16;
  return static_cast<unsigned>(n < cap ? (n > 0 ? n : 1) : cap);
}

void ce_forward_cuda(KernelContext& ctx) {
  const Tensor& logits = ctx.inputs[0];
  const Tensor& labels = ctx.inputs[1];
  const bool mean = ctx.args<CrossEntropyArgs>().mean;
  int64_t n = logits.size(0), c = logits.size(1);
  auto s = cuda_stream(ctx.device);
  Tensor rows = Tensor::empty({n}, DType::f64, logits.device());
  dispatch_float(logits.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_int(labels.dtype(), ctx.op, [&](auto ltag) {
      using L = decltype(ltag);
      if (n > 0 && cached_rows<T>(c, logits.raw_data())) {
        ce_rows_cached_kernel<T, L><<<cached_blocks(n), kCachedThreads, 0, s>>>(
            in_ptr<T>(logits), in_ptr<L>(labels), n, c, out_ptr<double>(rows),
            error_record(ctx.device), ctx.site);
        QG_CUDA_CHECK_LAUNCH(ctx.op);
      } else if (n > 0) {
        ce_rows_kernel<T, L><<<row_blocks(n), kThreads, 0, s>>>(
            in_ptr<T>(logits), in_ptr<L>(labels), n, c, out_ptr<double>(rows),
            error_record(ctx.device), ctx.site);
        QG_CUDA_CHECK_LAUNCH(ctx.op);
      }
    });
    using Loss = cross_entropy_loss_t<T>;
    ce_total_kernel<Loss>
        <<<1, 1024, 0, s>>>(in_ptr<double>(rows), n, mean, out_ptr<Loss>(ctx.outputs[0]));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void ce_backward_cuda(KernelContext& ctx) {
  const Tensor& logits = ctx.inputs[0];
  const Tensor& labels = ctx.inputs[1];
  const bool mean = ctx.args<CrossEntropyArgs>().mean;
  int64_t n = logits.size(0), c = logits.size(1);
  if (n == 0 || c == 0) return;
  dispatch_float(logits.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_int(labels.dtype(), ctx.op, [&](auto ltag) {
      using L = decltype(ltag);
      if (cached_rows<T>(c, logits.raw_data(), ctx.outputs[0].raw_data()))
        ce_backward_cached_kernel<T, L>
            <<<cached_blocks(n), kCachedThreads, 0, cuda_stream(ctx.device)>>>(
                in_ptr<T>(logits), in_ptr<L>(labels),
                in_ptr<cross_entropy_loss_t<T>>(ctx.inputs[2]), n, c, mean,
                out_ptr<T>(ctx.outputs[0]), error_record(ctx.device), ctx.site);
      else
        ce_backward_kernel<T, L><<<row_blocks(n), kThreads, 0, cuda_stream(ctx.device)>>>(
            in_ptr<T>(logits), in_ptr<L>(labels), in_ptr<cross_entropy_loss_t<T>>(ctx.inputs[2]), n,
            c, mean, out_ptr<T>(ctx.outputs[0]), error_record(ctx.device), ctx.site);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  });
}

}  // namespace

void add_loss_cuda_kernels(OpRegistry& r) {
  r.get_mutable("softmax_cross_entropy")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, ce_forward_cuda});
  r.get_mutable("softmax_cross_entropy_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, ce_backward_cuda});
}

}  // namespace qg
