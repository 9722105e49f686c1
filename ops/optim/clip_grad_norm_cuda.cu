// The CUDA clip_grad_norm kernel: a two-pass deterministic reduction over every gradient.
// Pass 1 takes the gradients as a list of pointers in the kernel's parameters (up to
// kTensorsPerLaunch per launch, so a model's ~100 gradients need a handful of launches, not
// one each): block (b, k) sums the squares of slice b of gradient k in f64, over a fixed
// thread assignment and tree order, into partial[k][b]. Pass 2, one block, adds each
// gradient's kSplits partials in a fixed order, rounds its norm to f32 and accumulates the
// total as the CPU kernel does (clip_grad_norm_op.cpp). Nothing depends on the device's size,
// so every GPU gives the same bits, and nothing waits for the host.
#include <cmath>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/optim/optim_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kTensorsPerLaunch = 32;
constexpr int kSplits = 64;  // blocks per gradient in pass 1, threads of pass 2
constexpr int kThreads = 256;

struct GradList {
  const void* data[kTensorsPerLaunch];
  int64_t numel[kTensorsPerLaunch];
  int32_t is_f64[kTensorsPerLaunch];
};

template <typename T>
__device__ double slice_sum_of_squares(const T* x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{kSplits} * blockDim.x) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  return acc;
}

__global__ void partial_sums_kernel(GradList list, double* partial) {
  const int k = blockIdx.y;
  const double acc =
      list.is_f64[k] ? slice_sum_of_squares(static_cast<const double*>(list.data[k]), list.numel[k])
                     : slice_sum_of_squares(static_cast<const float*>(list.data[k]), list.numel[k]);
  const double sum = block_reduce(acc, [](double a, double b) { return a + b; });
  if (threadIdx.x == 0) partial[int64_t{k} * kSplits + blockIdx.x] = sum;
}

__global__ void total_norm_kernel(const double* partial, int64_t tensors, float max_norm,
                                  float* total_norm, float* clip_coef, DeviceErrorRecord* err,
                                  int32_t node) {
  double total_sq = 0.0;
  for (int64_t k = 0; k < tensors; ++k) {
    const double s =
        block_reduce(partial[k * kSplits + threadIdx.x], [](double a, double b) { return a + b; });
    const double norm = static_cast<float>(sqrt(s));
    total_sq += norm * norm;
  }
  if (threadIdx.x != 0) return;
  const float total = static_cast<float>(sqrt(total_sq));
  *total_norm = total;
  if (!isfinite(total)) {
    report_device_error(err, kNonFiniteGradNorm, node, 0, static_cast<double>(total));
    *clip_coef = nanf("");  // every adamw node reading it skips its update
    return;
  }
  const float coef = (1.0f / (total + 1e-6f)) * max_norm;
  *clip_coef = coef < 1.0f ? coef : 1.0f;
}

void clip_grad_norm_cuda(KernelContext& ctx) {
  auto stream = cuda_stream(ctx.device);
  const int64_t tensors = static_cast<int64_t>(ctx.inputs.size());
  // Scratch for the partial sums: a StaticRun's pool serves it, so a captured step allocates
  // nothing.
  Tensor partial = Tensor::empty({tensors * kSplits}, DType::f64, ctx.outputs[0].device());
  for (int64_t first = 0; first < tensors; first += kTensorsPerLaunch) {
    GradList list{};
    const int count = static_cast<int>(std::min<int64_t>(kTensorsPerLaunch, tensors - first));
    for (int j = 0; j < count; ++j) {
      const Tensor& g = ctx.inputs[first + j];
      QG_CHECK(g.is_contiguous(), ctx.op, "gradients must be contiguous");
      list.data[j] = g.raw_data();
      list.numel[j] = g.numel();
      list.is_f64[j] = g.dtype() == DType::f64;
    }
    partial_sums_kernel<<<dim3(kSplits, count), kThreads, 0, stream>>>(
        list, partial.data<double>() + first * kSplits);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
  total_norm_kernel<<<1, kSplits, 0, stream>>>(
      partial.data<double>(), tensors, static_cast<float>(ctx.args<ClipGradNormArgs>().max_norm),
      ctx.outputs[0].data<float>(), ctx.outputs[1].data<float>(), error_record(ctx.device),
      ctx.site);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_clip_grad_norm_cuda_kernel(OpRegistry& r) {
  r.get_mutable("clip_grad_norm")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, clip_grad_norm_cuda});
}

}  // namespace qg
