// CUDA kernel of fused_ste_optimizer: the plain sgd / adam kernel (ops/optim/optim_cuda.cuh)
// with element i's gradient read as `mask bit i ? dy[i] : +0`, the select ste_backward's CUDA
// kernel evaluates (it stores dy's bits or from_math<T>(0) = +0; the plain step then loads
// them back). Every float operation of the update is the shared kernel code, compiled with
// --fmad=false like the plain step, so the fused node's parameter, momentum / moments and
// step counter are bit-identical to ste_backward followed by the step on the GPU.
#include "ops/fused/ste_optimizer/ste_optimizer.h"
#include "ops/optim/optim_cuda.cuh"

namespace qg {
namespace {

template <typename T>
struct MaskedGrad {
  const T* dy;
  const uint8_t* mask;
  __device__ T operator()(int64_t i) const { return (mask[i >> 3] >> (i & 7)) & 1u ? dy[i] : T(0); }
};

template <typename T>
void run(KernelContext& ctx) {
  const KernelPart& step = ctx.part(1);
  const MaskedGrad<T> grad{ctx.inputs[1].data<T>(), ctx.inputs[2].data<uint8_t>()};
  if (step.op->name == "sgd")
    optim_cuda::launch_sgd<T>(ctx, step.args<SgdArgs>(), grad);
  else
    optim_cuda::launch_adam<T>(ctx, step.args<AdamArgs>(), grad);
}

void fused_ste_optimizer_cuda(KernelContext& ctx) {
  check_fused_ste_optimizer_inputs(ctx);
  if (ctx.inputs[0].dtype() == DType::f64)
    run<double>(ctx);
  else
    run<float>(ctx);
}

}  // namespace

void add_fused_ste_optimizer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_ste_optimizer")
      .kernels.push_back({DeviceType::cuda, {DType::f32, DType::f64}, fused_ste_optimizer_cuda});
}

}  // namespace qg
