// fused_ste_layer_norm_backward(dy, mask, x, gamma, mean, rstd) -> (dx, dgamma, dbeta): an
// ste_backward (dy where the mask bit is set, else +0) and the layer_norm_backward that reads
// it as its incoming gradient, made into one node by the fuse_ste_backward pass. In a
// pre-norm transformer the LayerNorm's output is fake-quantized before the attention and
// MLP projections; unfused, the STE writes the masked gradient and layer_norm_backward reads
// it straight back (twice: for dx and for the column sums of dgamma and dbeta). The fused
// node applies the mask where layer_norm_backward loads dy.
//
// The node keeps the two original nodes in `fused_from`. The CPU kernel runs their kernels
// back to back (the unfused graph by construction); the CUDA kernel runs layer_norm_backward's
// own kernels with the mask applied on load (ops/norm/layer_norm_backward_cuda.cuh), so it
// is bit-identical to the two CUDA kernels.
#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/fused_observe_quantize.h"
#include "ops/fused/fused_ste_backward.h"

namespace qg {
namespace {

void fused_ste_layer_norm_backward_cpu(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs.at(0);
  const std::string op = "fused_ste_layer_norm_backward";
  std::vector<Tensor> no_states;
  std::vector<Tensor> masked = run_original_kernel(
      op, ctx.node.fused_from.at(0), DeviceType::cpu, dy.dtype(), {dy, ctx.inputs.at(1)},
      {Tensor::empty(dy.shape(), dy.dtype(), dy.device())}, no_states, ctx);
  ctx.outputs = run_original_kernel(
      op, ctx.node.fused_from.at(1), DeviceType::cpu, dy.dtype(),
      {masked[0], ctx.inputs.at(2), ctx.inputs.at(3), ctx.inputs.at(4), ctx.inputs.at(5)},
      ctx.outputs, no_states, ctx);
}

}  // namespace

void define_fused_ste_layer_norm_backward_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_layer_norm_backward");
  op.doc =
      "An ste_backward and the layer_norm_backward that reads it as dy, fused by the "
      "fuse_ste_backward pass: layer_norm_backward(mask ? dy : +0, x, gamma, mean, rstd).";
  op.inputs = {"dy", "mask", "x", "gamma", "mean", "rstd"};
  op.outputs = {"dx", "dgamma", "dbeta"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_backward pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, {}, fused_ste_layer_norm_backward_cpu});
}

}  // namespace qg
