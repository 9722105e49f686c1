// fused_multi_tensor_adamw(param_0, grad_0, ..., param_{n-1}, grad_{n-1}, lr, grad_scale): the
// adamw steps of n parameters that share their rate, their gradient scale and their
// hyper-parameters, made into one node by the fuse_multi_tensor_adamw pass. On CUDA the n
// updates run as a few launches over a table of tensors (multi_tensor_adamw_cuda.cu) instead
// of two launches per parameter; the CPU kernel runs each part's own adamw kernel.
//
// Every part keeps its own states (exp_avg, exp_avg_sq, step: the fused node's states are the
// parts', concatenated), so checkpoints key them by the original step nodes' names and a fused
// graph and an unfused one exchange them. Each element's update is the adamw kernel's code, so
// the result is bit-identical to the unfused steps.
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {

void check_multi_tensor_adamw_inputs(const KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  QG_CHECK(parts >= 1 && ctx.inputs.size() == 2 * parts + 2, ctx.op, ctx.inputs.size(),
           " inputs for ", parts,
           " adamw parts; expected a (param, grad) pair per part, lr and "
           "grad_scale");
  QG_CHECK(ctx.states.size() == 3 * parts, ctx.op, ctx.states.size(), " states for ", parts,
           " adamw parts (exp_avg, exp_avg_sq, step each)");
  const DType dtype = ctx.inputs[0].dtype();
  QG_CHECK(dtype == DType::f32 || dtype == DType::f64, ctx.op, "params must be f32 or f64, got ",
           ctx.inputs[0].str());
  for (size_t k = 0; k < parts; ++k) {
    QG_CHECK(ctx.part(k).op->name == "adamw", ctx.op, "part ", k, " is a ", ctx.part(k).op->name,
             " step, not adamw");
    const Tensor& p = ctx.inputs[2 * k];
    const Tensor& g = ctx.inputs[2 * k + 1];
    QG_CHECK(p.dtype() == dtype && g.dtype() == dtype && g.shape() == p.shape(), ctx.op, "part ", k,
             ": param ", p.str(), " and grad ", g.str(), " must share the dtype ",
             dtype_name(dtype), " and one shape");
    QG_CHECK(p.is_contiguous() && g.is_contiguous(), ctx.op, "part ", k,
             ": param and grad must be contiguous");
  }
  const Tensor& lr = ctx.inputs[2 * parts];
  const Tensor& scale = ctx.inputs[2 * parts + 1];
  QG_CHECK(lr.dtype() == DType::f64 && lr.numel() == 1, ctx.op, "lr must be an f64 scalar, got ",
           lr.str());
  QG_CHECK(scale.dtype() == DType::f32 && scale.numel() == 1, ctx.op,
           "grad_scale must be an f32 scalar, got ", scale.str());
}

namespace {

// Each part's adamw kernel on its (param, grad, lr, grad_scale) and its three states. The rate
// and scale are checked by the first part before any update, so a bad one leaves every
// parameter and state as it was, as in the unfused graph, where every step raises alike.
void multi_tensor_adamw_cpu(KernelContext& ctx) {
  check_multi_tensor_adamw_inputs(ctx);
  const size_t parts = ctx.num_parts();
  const Tensor& lr = ctx.inputs[2 * parts];
  const Tensor& scale = ctx.inputs[2 * parts + 1];
  for (size_t k = 0; k < parts; ++k) {
    std::vector<Tensor> states(ctx.states.begin() + 3 * k, ctx.states.begin() + 3 * k + 3);
    run_original_kernel(ctx.op, ctx.part(k), DeviceType::cpu, ctx.inputs[0].dtype(),
                        {ctx.inputs[2 * k], ctx.inputs[2 * k + 1], lr, scale}, {}, states, ctx);
  }
}

}  // namespace

#ifdef QG_WITH_CUDA
void add_fused_multi_tensor_adamw_cuda_kernel(OpRegistry& r);  // multi_tensor_adamw_cuda.cu
#endif

void define_fused_multi_tensor_adamw_op(OpRegistry& r) {
  OpDef& op = r.define("fused_multi_tensor_adamw");
  op.doc =
      "The adamw steps of several parameters sharing rate, grad_scale and hyper-parameters, "
      "fused by the fuse_multi_tensor_adamw pass: inputs (param, grad) pairs, lr, grad_scale; "
      "each part's states kept as its own; updates the params in place.";
  op.inputs = {"params_and_grads"};
  op.variadic = true;
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_multi_tensor_adamw pass, not by apply()");
  };
  op.is_source = false;
  op.side_effects = true;
  op.kernels.push_back({DeviceType::cpu, {}, multi_tensor_adamw_cpu});
#ifdef QG_WITH_CUDA
  add_fused_multi_tensor_adamw_cuda_kernel(r);
#endif
  op.fusion_rules = {multi_tensor_adamw_fusion_rule()};
}

}  // namespace qg
