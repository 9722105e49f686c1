// The CUDA kernels of fused_multi_tensor_adamw: the parts' tensors in tables of up to
// kMultiTensorChunk (passed by value as kernel parameters, so nothing is copied to the device
// and a CUDA graph captures them as they are), two launches per table: one advances every
// part's step counter after checking the rate and the scale (a bad one is a device error,
// reported under the fused node, and changes nothing), one updates every element. Each block
// of the update takes kElementsPerBlock elements of one tensor; the block-to-tensor map is a
// prefix sum of the tensors' block counts in the table. The element math is adamw's own
// (ops/optim/adamw_math.cuh), so the result is the unfused steps' bit for bit.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"
#include "ops/optim/adamw_math.cuh"
#include "ops/optim/optim_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;
constexpr int64_t kElementsPerBlock = 4 * kThreads;

template <typename T>
struct TensorTable {
  T* p[kMultiTensorChunk];
  const T* g[kMultiTensorChunk];
  T* m[kMultiTensorChunk];
  T* v[kMultiTensorChunk];
  int64_t* step[kMultiTensorChunk];
  int64_t n[kMultiTensorChunk];
  int64_t first_block[kMultiTensorChunk + 1];  // prefix sum of the tensors' blocks
  int count;
};

// Advances every part's step counter and forms its scalars once (adamw_scalars: two
// double-precision pow calls, which each thread of the update used to make for its four
// elements).
template <typename T>
__global__ void advance_steps(TensorTable<T> t, const double* lr, const float* scale, double beta1,
                              double beta2, double eps, double weight_decay, bool decoupled,
                              optim_cuda::AdamWScalars<T>* scalars, DeviceErrorRecord* err,
                              int32_t node) {
  const double rate = *lr;
  const float s = *scale;
  if (!optim_cuda::adamw_usable(rate, s)) {
    if (threadIdx.x == 0) {
      if (!isfinite(s))
        report_device_error(err, kNonFiniteGradNorm, node, 0, static_cast<double>(s));
      else
        report_device_error(err, kBadLearningRate, node, 0, rate);
    }
    return;
  }
  for (int k = threadIdx.x; k < t.count; k += blockDim.x)
    scalars[k] = optim_cuda::adamw_scalars<T>(rate, s, ++*t.step[k], beta1, beta2, eps,
                                              weight_decay, decoupled);
}

template <typename T>
__global__ void update(TensorTable<T> t, const double* lr, const float* scale,
                       const optim_cuda::AdamWScalars<T>* scalars) {
  if (!optim_cuda::adamw_usable(*lr, *scale)) return;
  const int64_t block = blockIdx.x;
  int k = 0;
  while (k + 1 < t.count && t.first_block[k + 1] <= block) ++k;
  const optim_cuda::AdamWScalars<T> a = scalars[k];
  const int64_t begin = (block - t.first_block[k]) * kElementsPerBlock;
  const int64_t end = begin + kElementsPerBlock < t.n[k] ? begin + kElementsPerBlock : t.n[k];
  T* p = t.p[k];
  const T* g = t.g[k];
  T* m = t.m[k];
  T* v = t.v[k];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    optim_cuda::adamw_element(a, p[i], g[i], m[i], v[i]);
}

template <typename T>
void multi_tensor_adamw_cuda(KernelContext& ctx) {
  check_multi_tensor_adamw_inputs(ctx);
  const AdamWArgs& a = ctx.part(0).args<AdamWArgs>();
  const size_t parts = ctx.num_parts();
  const double* lr = ctx.inputs[2 * parts].data<double>();
  const float* scale = ctx.inputs[2 * parts + 1].data<float>();
  auto stream = cuda_stream(ctx.device);
  for (size_t first = 0; first < parts; first += kMultiTensorChunk) {
    TensorTable<T> t{};
    t.count = static_cast<int>(std::min<size_t>(kMultiTensorChunk, parts - first));
    t.first_block[0] = 0;
    for (int j = 0; j < t.count; ++j) {
      const size_t k = first + static_cast<size_t>(j);
      t.p[j] = ctx.inputs[2 * k].data<T>();
      t.g[j] = ctx.inputs[2 * k + 1].data<T>();
      t.m[j] = ctx.states[3 * k].data<T>();
      t.v[j] = ctx.states[3 * k + 1].data<T>();
      t.step[j] = ctx.states[3 * k + 2].data<int64_t>();
      t.n[j] = ctx.inputs[2 * k].numel();
      t.first_block[j + 1] =
          t.first_block[j] + (t.n[j] + kElementsPerBlock - 1) / kElementsPerBlock;
    }
    Tensor scalars =
        Tensor::empty({static_cast<int64_t>(t.count * sizeof(optim_cuda::AdamWScalars<T>))},
                      DType::u8, ctx.inputs[0].device());
    auto* table = static_cast<optim_cuda::AdamWScalars<T>*>(scalars.raw_data());
    advance_steps<T><<<1, 64, 0, stream>>>(t, lr, scale, a.beta1, a.beta2, a.eps, a.weight_decay,
                                           a.decoupled, table, error_record(ctx.device), ctx.site);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    const int64_t blocks = t.first_block[t.count];
    if (blocks == 0) continue;
    QG_CHECK(blocks <= 0x7fffffff, ctx.op, blocks, " blocks exceed one launch");
    update<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, lr, scale, table);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

}  // namespace

void add_fused_multi_tensor_adamw_cuda_kernel(OpRegistry& r) {
  r.get_mutable("fused_multi_tensor_adamw")
      .kernels.push_back({DeviceType::cuda, {}, [](KernelContext& c) {
                            if (c.inputs.at(0).dtype() == DType::f64)
                              multi_tensor_adamw_cuda<double>(c);
                            else
                              multi_tensor_adamw_cuda<float>(c);
                          }});
}

}  // namespace qg
