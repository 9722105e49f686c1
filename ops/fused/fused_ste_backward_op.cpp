// fused_ste_backward(dy, mask, x) -> dx: an ste_backward (the gradient of a fake-quantize:
// dy where the mask bit is set, else +0) and the element-wise activation backward that
// reads it (relu, gelu or silu backward: dx = f(masked dy, x)), made into one node by the
// fuse_ste_backward pass (runtime/passes). Where a fake-quantizer follows an activation,
// as in conv-bn-relu and the MLP's GELU, the unfused backward writes the masked gradient
// and reads it straight back; the fused node reads dy, the mask bits and x once.
//
// The node keeps the two original nodes in `fused_from`. The CPU kernel runs their kernels
// back to back, so it is the unfused graph by construction; the CUDA kernel evaluates the
// same two expressions per element in one pass (bit-identical to the two CUDA kernels).
#include "ops/fused/fused_ste_backward.h"

#include "core/error.h"
#include "core/graph.h"

namespace qg {
namespace {

void fused_ste_backward_cpu(KernelContext& ctx) {
  const Node& ste = ctx.node.fused_from.at(0);
  const Node& act = ctx.node.fused_from.at(1);
  const Tensor& dy = ctx.inputs.at(0);
  std::vector<Tensor> no_states;
  Tensor masked = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  KernelContext s{ste.op->name, ste,        ste.attrs, {dy, ctx.inputs.at(1)}, {masked}, no_states,
                  ctx.training, ctx.stream, nullptr};
  auto kernel = [&](const Node& n) {
    const KernelDef* k = n.op->find_kernel(DeviceType::cpu, dy.dtype());
    QG_CHECK(k != nullptr, "fused_ste_backward", "no cpu kernel for ", n.op->name, " on ",
             dtype_name(dy.dtype()));
    return k;
  };
  kernel(ste)->fn(s);
  KernelContext a{act.op->name, act,       act.attrs,    {s.outputs[0], ctx.inputs.at(2)},
                  ctx.outputs,  no_states, ctx.training, ctx.stream,
                  nullptr};
  kernel(act)->fn(a);
  ctx.outputs = a.outputs;
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
  op.kernels.push_back({DeviceType::cpu, {}, fused_ste_backward_cpu});
}

}  // namespace qg
