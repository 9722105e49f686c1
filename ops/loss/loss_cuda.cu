// CUDA kernels for softmax_cross_entropy and its backward, in f64 like the CPU kernels: one
// block per row (max, then sum of exp, both deterministic block reductions), the per-row
// losses summed by a single block in a fixed order. A label outside [0, C) is recorded in
// the device error buffer and raised at the end of the run, as the CPU kernel raises it.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/loss/loss_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

// std::max's selection (a NaN operand on the right is ignored), as the CPU row max uses.
struct MaxOp {
  __device__ double operator()(double a, double b) const { return a < b ? b : a; }
};

// log-sum-exp of one row, computed by the whole block.
template <typename T>
__device__ double row_lse(const T* row, int64_t c) {
  double mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    mx = MaxOp{}(mx, static_cast<double>(to_math(row[j])));
  mx = block_reduce(mx, MaxOp{});
  double s = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    s += exp(static_cast<double>(to_math(row[j])) - mx);
  s = block_reduce(s, SumOp{});
  return mx + log(s);
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
    double lse = row_lse(row, c);
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
  double g = static_cast<double>(dloss[0]) / (mean ? static_cast<double>(n) : 1.0);
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = logits + i * c;
    double lse = row_lse(row, c);
    int64_t y = checked_label(labels, i, c, err, node);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      double p = exp(static_cast<double>(to_math(row[j])) - lse);
      out[i * c + j] = from_math<T>(static_cast<math_of<T>>((p - (j == y ? 1.0 : 0.0)) * g));
    }
  }
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
      if (n > 0) {
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
