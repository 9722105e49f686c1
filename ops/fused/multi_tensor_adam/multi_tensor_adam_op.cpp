// fused_multi_tensor_adam(param_0, grad_0, ..., param_{n-1}, grad_{n-1}): the adam steps of n
// parameters that share their hyper-parameters and their parameter and gradient dtypes, made
// into one node by the fuse_multi_tensor_adam pass. On CUDA the n updates run as two launches
// per kMultiTensorChunk parameters (multi_tensor_adam_cuda.cu) instead of two per parameter:
// the 207M Llama's step has 111 parameters, 25 of them norm weights of 1024 elements, whose
// launches cost more than their bytes. The CPU kernel runs each part's own adam kernel.
//
// Every part keeps its own states (exp_avg, exp_avg_sq, step: the fused node's states are the
// parts', concatenated), so checkpoints key them by the original step nodes' names. Each
// element's update is the adam kernel's code (ops/optim/optim_cuda.cuh adam_element), so the
// result is the unfused steps' bit for bit.
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {

void check_multi_tensor_adam_inputs(const KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  QG_CHECK(parts >= 1 && ctx.inputs.size() == 2 * parts && ctx.states.size() == 3 * parts, ctx.op,
           ctx.inputs.size(), " inputs and ", ctx.states.size(), " states for ", parts,
           " adam parts; expected a (param, grad) pair and 3 states per part");
  const DType p0 = ctx.inputs[0].dtype(), g0 = ctx.inputs[1].dtype();
  QG_CHECK(p0 == DType::f32 || p0 == DType::f64, ctx.op, "params must be f32 or f64, got ",
           ctx.inputs[0].str());
  QG_CHECK(g0 == p0 || (p0 == DType::f32 && (g0 == DType::bf16 || g0 == DType::f16)), ctx.op,
           "grads must have the params' dtype (or bf16/f16 for f32 params), got ",
           ctx.inputs[1].str(), " for ", ctx.inputs[0].str());
  for (size_t k = 0; k < parts; ++k) {
    QG_CHECK(ctx.part(k).op->name == "adam", ctx.op, "part ", k, " is a ", ctx.part(k).op->name,
             " step, not adam");
    const Tensor& p = ctx.inputs[2 * k];
    const Tensor& g = ctx.inputs[2 * k + 1];
    QG_CHECK(p.dtype() == p0 && g.dtype() == g0 && g.shape() == p.shape(), ctx.op, "part ", k,
             ": param ", p.str(), " and grad ", g.str(), " must be ", dtype_name(p0), " and ",
             dtype_name(g0), " of one shape");
    QG_CHECK(p.is_contiguous() && g.is_contiguous(), ctx.op, "part ", k,
             ": param and grad must be contiguous");
  }
}

namespace {

void multi_tensor_adam_cpu(KernelContext& ctx) {
  check_multi_tensor_adam_inputs(ctx);
  for (size_t k = 0; k < ctx.num_parts(); ++k) {
    std::vector<Tensor> states(ctx.states.begin() + 3 * k, ctx.states.begin() + 3 * k + 3);
    run_original_kernel(ctx.op, ctx.part(k), DeviceType::cpu, ctx.inputs[0].dtype(),
                        {ctx.inputs[2 * k], ctx.inputs[2 * k + 1]}, {}, states, ctx);
  }
}

}  // namespace

#ifdef QG_WITH_CUDA
void add_fused_multi_tensor_adam_cuda_kernel(OpRegistry& r);  // multi_tensor_adam_cuda.cu
#endif

void define_fused_multi_tensor_adam_op(OpRegistry& r) {
  OpDef& op = r.define("fused_multi_tensor_adam");
  op.doc =
      "The adam steps of several parameters sharing hyper-parameters and dtypes, fused by the "
      "fuse_multi_tensor_adam pass: inputs (param, grad) pairs; each part's states kept as its "
      "own; updates the params in place.";
  op.inputs = {"params_and_grads"};
  op.variadic = true;
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_multi_tensor_adam pass, not by apply()");
  };
  op.is_source = false;
  op.side_effects = true;
  op.kernels.push_back({DeviceType::cpu, {}, multi_tensor_adam_cpu});
#ifdef QG_WITH_CUDA
  add_fused_multi_tensor_adam_cuda_kernel(r);
#endif
  op.fusion_rules = {multi_tensor_adam_fusion_rule()};
}

}  // namespace qg
