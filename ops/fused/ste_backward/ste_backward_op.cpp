// fused_ste_backward(dy, mask, x) -> dx: an ste_backward (the gradient of a fake-quantize:
// dy where the mask bit is set, else +0) and the element-wise activation backward that
// reads it (relu, gelu or silu backward: dx = f(masked dy, x)), made into one node by the
// fuse_ste_backward pass (ste_backward_fusion.cpp). Where a fake-quantizer follows an activation,
// as in conv-bn-relu and the MLP's GELU, the unfused backward writes the masked gradient
// and reads it straight back; the fused node reads dy, the mask bits and x once.
//
// The node keeps the two original nodes in `fused_from`. The CPU kernel runs their kernels
// back to back, so it is the unfused graph by construction; the CUDA kernel evaluates the
// same two expressions per element in one pass (bit-identical to the two CUDA kernels).
#include "ops/fused/ste_backward/ste_backward.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"
#include "ops/fused/ste_backward/ste_backward_fusion.h"

namespace qg {
namespace {

void fused_ste_backward_cpu(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs.at(0);
  const std::string op = "fused_ste_backward";
  std::vector<Tensor> no_states;
  std::vector<Tensor> masked =
      run_original_kernel(op, ctx.part(0), DeviceType::cpu, dy.dtype(), {dy, ctx.inputs.at(1)},
                          {Tensor::empty(dy.shape(), dy.dtype(), dy.device())}, no_states, ctx);
  ctx.outputs = run_original_kernel(op, ctx.part(1), DeviceType::cpu, dy.dtype(),
                                    {masked[0], ctx.inputs.at(2)}, ctx.outputs, no_states, ctx);
}

}  // namespace

const std::vector<std::string>& ste_fusible_consumers() {
  static const std::vector<std::string> ops = {"relu_backward", "gelu_backward", "silu_backward"};
  return ops;
}

void define_fused_ste_backward_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_backward");
  op.doc =
      "An ste_backward and the activation backward that reads it (relu, gelu or silu), fused by "
      "the fuse_ste_backward pass: dx = f(mask ? dy : +0, x).";
  op.inputs = {"dy", "mask", "x"};
  op.outputs = {"dx"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_backward pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, fused_ste_backward_cpu});
  op.fusion_rules = {ste_backward_fusion_rule()};
}

}  // namespace qg
