// The per-tensor cooperative fused observer + fake-quantize kernel with an element-wise
// activation applied to x as it is loaded: the node the fuse_activation_prologue pass makes
// of relu/gelu/silu -> observer + fake_quantize. The activation's output is never written
// or re-read; each pack is transformed by the activation's own element expression
// (ops/activation/activation_fwd.cuh) with the same rounding, so the node equals the
// unfused activation + fused observer + fake-quantize bit for bit. Other layouts fall back
// to the activation's kernel into a temporary, then the node's usual path.
#include "ops/activation/activation_fwd.cuh"
#include "ops/activation/gelu_args.h"
#include "ops/fused/observe_quantize/cuda_cooperative.cuh"

namespace qg::cuda::fused {
namespace {

using namespace coop;

template <typename F>
bool launch_with(KernelContext& ctx, const FusedArgs& a) {
  switch (ctx.inputs[0].dtype()) {
    case DType::f32:
      return launch_tensor<false, float, ActivationPrologue<F>>(ctx, a);
    case DType::bf16:
      return launch_tensor<false, __nv_bfloat16, ActivationPrologue<F>>(ctx, a);
    case DType::f16:
      return launch_tensor<false, __half, ActivationPrologue<F>>(ctx, a);
    default:
      return false;
  }
}

}  // namespace

bool launch_fused_tensor_prologue(KernelContext& ctx, const FusedArgs& a,
                                  const KernelPart& activation) {
  const std::string& op = activation.op->name;
  if (op == "relu") return launch_with<ReluF>(ctx, a);
  if (op == "silu") return launch_with<SiluF>(ctx, a);
  if (op == "gelu")  // the same choice as gelu's own CUDA kernel
    return activation.args<GeluArgs>().tanh ? launch_with<GeluTanhF>(ctx, a)
                                            : launch_with<GeluErfF>(ctx, a);
  return false;
}

}  // namespace qg::cuda::fused
