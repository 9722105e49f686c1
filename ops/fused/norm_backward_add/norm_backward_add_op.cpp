// fused_rms_norm_backward_add(dy, x, weight, rstd, residual) -> (y, dweight): rms_norm's
// backward whose dx goes straight into the gradient accumulation y = residual + dx; and
// fused_rms_norm_backward_add_cast, which also writes y cast to bf16/f16 (y_narrow). Made by
// the fuse_norm_backward_add pass. In a pre-norm decoder's backward every norm's dx is added to
// the residual stream's gradient, and (bf16 mixed precision) that sum is cast for the next
// GEMMs' backward: the unfused graph writes dx and reads it back, then reads the sum again to
// cast it. The fused kernel writes dx only as part of the sum, and the narrow copy from the
// same registers. Bit for bit the same: the sum is the add kernel's f32 (or f64) add of the
// same rounded dx, and the narrow copy the cast kernel's rounding of the same sum. The CPU
// kernel runs the parts' own kernels in order.
#include "ops/fused/norm_backward_add/norm_backward_add.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {

void check_fused_norm_backward_add_inputs(const KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  const bool cast = parts == 3;
  QG_CHECK((parts == 2 || parts == 3) && ctx.part(0).op->name == "rms_norm_backward" &&
               ctx.part(1).op->name == "add" && (!cast || ctx.part(2).op->name == "cast"),
           ctx.op, "fused_from must be {rms_norm_backward, add[, cast]}");
  QG_CHECK(ctx.inputs.size() == 5 && ctx.outputs.size() == (cast ? 3u : 2u), ctx.op,
           "takes inputs {dy, x, weight, rstd, residual} and outputs {y, dweight",
           cast ? ", y_narrow}" : "}", ", got ", ctx.inputs.size(), " inputs and ",
           ctx.outputs.size(), " outputs");
  const Tensor &x = ctx.inputs[1], &residual = ctx.inputs[4], &y = ctx.outputs[0];
  QG_CHECK(
      residual.dtype() == x.dtype() && residual.shape() == x.shape() && residual.is_contiguous(),
      ctx.op, "residual ", residual.str(), " must be contiguous with x's type ", x.str(),
      " (the fused add does not broadcast)");
  QG_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape(), ctx.op, "y ", y.str(),
           " must have x's type ", x.str());
  if (cast) {
    const Tensor& n = ctx.outputs[2];
    QG_CHECK((n.dtype() == DType::bf16 || n.dtype() == DType::f16) && x.dtype() == DType::f32 &&
                 n.shape() == x.shape(),
             ctx.op, "y_narrow ", n.str(), " must be the bf16/f16 copy of an f32 y ", y.str());
  }
}

namespace {

void norm_backward_add_cpu(KernelContext& ctx) {
  check_fused_norm_backward_add_inputs(ctx);
  std::vector<Tensor> no_states;
  const DType d = ctx.inputs[1].dtype();
  const Tensor& x = ctx.inputs[1];
  std::vector<Tensor> grads =
      run_original_kernel(ctx.op, ctx.part(0), DeviceType::cpu, d,
                          {ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], ctx.inputs[3]},
                          {Tensor::empty(x.shape(), d), ctx.outputs[1]}, no_states, ctx);
  ctx.outputs[1] = grads[1];
  ctx.outputs[0] =
      run_original_kernel(ctx.op, ctx.part(1), DeviceType::cpu, d, {ctx.inputs[4], grads[0]},
                          {ctx.outputs[0]}, no_states, ctx)[0];
  if (ctx.num_parts() == 3)
    ctx.outputs[2] = run_original_kernel(ctx.op, ctx.part(2), DeviceType::cpu, d, {ctx.outputs[0]},
                                         {ctx.outputs[2]}, no_states, ctx)[0];
}

void define(OpRegistry& r, const char* name, const char* doc, std::vector<std::string> outputs) {
  OpDef& op = r.define(name);
  op.doc = doc;
  op.inputs = {"dy", "x", "weight", "rstd", "residual"};
  op.outputs = std::move(outputs);
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_norm_backward_add pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, norm_backward_add_cpu});
}

}  // namespace

void define_fused_norm_backward_add_ops(OpRegistry& r) {
  define(r, "fused_rms_norm_backward_add",
         "rms_norm_backward whose dx is added to a residual gradient (y = residual + dx), fused "
         "by the fuse_norm_backward_add pass; also dweight.",
         {"y", "dweight"});
  define(r, "fused_rms_norm_backward_add_cast",
         "fused_rms_norm_backward_add that also writes y cast to bf16/f16 (y_narrow), fused by "
         "the fuse_norm_backward_add pass.",
         {"y", "dweight", "y_narrow"});
  r.get_mutable("fused_rms_norm_backward_add").fusion_rules = {norm_backward_add_fusion_rule()};
}

}  // namespace qg
