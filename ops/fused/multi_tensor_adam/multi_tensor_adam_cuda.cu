// The CUDA kernels of fused_multi_tensor_adam: the parts' tensors in tables of up to
// kMultiTensorChunk (passed by value as kernel parameters, so nothing is copied to the device
// and a CUDA graph captures them as they are), two launches per table: one advances every
// part's step counter and forms its bias-corrected scalars (in double, as the plain adam's
// advance kernel does), one updates every element. Each block of the update takes
// kElementsPerBlock elements of one tensor; the block-to-tensor map is a prefix sum of the
// tensors' block counts. The element math is adam's own (optim_cuda.cuh adam_element), so the
// result is the unfused steps' bit for bit.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"
#include "ops/optim/optim_args.h"
#include "ops/optim/optim_cuda.cuh"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;
constexpr int64_t kElementsPerBlock = 4 * kThreads;

template <typename T, typename G>
struct AdamTable {
  T* p[kMultiTensorChunk];
  const G* g[kMultiTensorChunk];
  T* m[kMultiTensorChunk];
  T* v[kMultiTensorChunk];
  int64_t* step[kMultiTensorChunk];
  int64_t n[kMultiTensorChunk];
  int64_t first_block[kMultiTensorChunk + 1];  // prefix sum of the tensors' blocks
  int count;
};

// scalars[2k], scalars[2k + 1]: part k's step size and sqrt(1 - beta2^t), after its step.
template <typename T, typename G>
__global__ void advance_steps(AdamTable<T, G> t, double lr, double beta1, double beta2,
                              T* scalars) {
  for (int k = threadIdx.x; k < t.count; k += blockDim.x) {
    const double s = static_cast<double>(++*t.step[k]);
    scalars[2 * k] = static_cast<T>(lr / (1.0 - pow(beta1, s)));
    scalars[2 * k + 1] = static_cast<T>(sqrt(1.0 - pow(beta2, s)));
  }
}

template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    update(AdamTable<T, G> t, const T* scalars, T b1, T b2, T omb1, T omb2, T eps, T wd) {
  const int64_t block = blockIdx.x;
  int k = 0;
  while (k + 1 < t.count && t.first_block[k + 1] <= block) ++k;
  const T step_size = scalars[2 * k], bc2_sqrt = scalars[2 * k + 1];
  const int64_t begin = (block - t.first_block[k]) * kElementsPerBlock;
  const int64_t end = begin + kElementsPerBlock < t.n[k] ? begin + kElementsPerBlock : t.n[k];
  T* p = t.p[k];
  const G* g = t.g[k];
  T* m = t.m[k];
  T* v = t.v[k];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    optim_cuda::adam_element(pi, static_cast<T>(to_math(g[i])), mi, vi, step_size, bc2_sqrt, b1, b2,
                             omb1, omb2, eps, wd);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

template <typename T, typename G>
void launch(KernelContext& ctx) {
  const AdamArgs& a = ctx.part(0).args<AdamArgs>();
  const size_t parts = ctx.num_parts();
  auto stream = cuda_stream(ctx.device);
  for (size_t first = 0; first < parts; first += kMultiTensorChunk) {
    AdamTable<T, G> t{};
    t.count = static_cast<int>(std::min<size_t>(kMultiTensorChunk, parts - first));
    t.first_block[0] = 0;
    for (int j = 0; j < t.count; ++j) {
      const size_t k = first + static_cast<size_t>(j);
      t.p[j] = ctx.inputs[2 * k].data<T>();
      t.g[j] = static_cast<const G*>(ctx.inputs[2 * k + 1].raw_data());
      t.m[j] = ctx.states[3 * k].data<T>();
      t.v[j] = ctx.states[3 * k + 1].data<T>();
      t.step[j] = ctx.states[3 * k + 2].data<int64_t>();
      t.n[j] = ctx.inputs[2 * k].numel();
      t.first_block[j + 1] =
          t.first_block[j] + (t.n[j] + kElementsPerBlock - 1) / kElementsPerBlock;
    }
    Tensor scalars =
        Tensor::empty(Shape(1, int64_t{2} * t.count), DTypeOf<T>::value, ctx.inputs[0].device());
    advance_steps<T, G><<<1, 64, 0, stream>>>(t, a.lr, a.beta1, a.beta2, scalars.data<T>());
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    const int64_t blocks = t.first_block[t.count];
    if (blocks == 0) continue;
    QG_CHECK(blocks <= 0x7fffffff, ctx.op, blocks, " blocks exceed one launch");
    update<T, G><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        t, scalars.data<T>(), static_cast<T>(a.beta1), static_cast<T>(a.beta2),
        static_cast<T>(1.0 - a.beta1), static_cast<T>(1.0 - a.beta2), static_cast<T>(a.eps),
        static_cast<T>(a.weight_decay));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

void multi_tensor_adam_cuda(KernelContext& ctx) {
  check_multi_tensor_adam_inputs(ctx);
  const DType p = ctx.inputs[0].dtype(), g = ctx.inputs[1].dtype();
  if (p == DType::f64) return launch<double, double>(ctx);
  if (g == DType::bf16) return launch<float, __nv_bfloat16>(ctx);
  if (g == DType::f16) return launch<float, __half>(ctx);
  launch<float, float>(ctx);
}

}  // namespace

void add_fused_multi_tensor_adam_cuda_kernel(OpRegistry& r) {
  r.get_mutable("fused_multi_tensor_adam")
      .kernels.push_back({DeviceType::cuda, {}, multi_tensor_adam_cuda});
}

}  // namespace qg
