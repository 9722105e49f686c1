// fused_scaled_softmax(x, scale) -> y = softmax(RN(x * scale)) and
// fused_scaled_softmax_backward(dy, y, scale) -> dx = RN(softmax_backward(dy, y) * scale):
// a `mul` by a one-element value and the last-axis softmax that is its only reader (and, in
// the backward, the softmax_backward and the `mul` by a one-element value that is its only
// reader), made into one node each by the fuse_scaled_softmax pass (scaled_softmax_fusion.cpp). In
// attention, softmax(q k^T / sqrt(d)) scales the whole score tensor; unfused, the scaled
// scores (and their gradient) are written and read straight back.
//
// Attributes: `axis`, the softmax's; `scale_first`, 1 when the scale was the mul's first
// operand (`mul(scale, x)`), so every kernel multiplies in the original operand order and a
// NaN operand propagates exactly as in the unfused mul. The node keeps the originals in
// `fused_from` ({mul, softmax} and {softmax_backward, mul}). The CPU kernels run them back
// to back, so CPU results are the unfused graph's by construction; the CUDA kernels
// (ops/softmax/softmax_cuda.cu) round the product to the storage type inside the softmax
// row pass exactly as the mul kernel rounds it.
#include "ops/fused/scaled_softmax/scaled_softmax.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/fused/common/run_original_kernel.h"
#include "ops/fused/scaled_softmax/scaled_softmax_fusion.h"
#include "ops/softmax/softmax_columns.h"

namespace qg {
namespace {

// The mul's operands in their original order.
std::vector<Tensor> mul_operands(const KernelContext& ctx, const Tensor& v, const Tensor& s) {
  if (ctx.args<SoftmaxArgs>().scale_first) return {s, v};
  return {v, s};
}

void reject_apply(const InferContext& ctx) {
  QG_FAIL(ctx.op, "fused nodes are created by the fuse_scaled_softmax pass, not by apply()");
}

}  // namespace

void check_fused_scaled_softmax_inputs(const KernelContext& ctx) {
  const bool backward = ctx.op == "fused_scaled_softmax_backward";
  const std::vector<KernelPart>& from = ctx.prepared.parts;
  const char* first = backward ? "softmax_backward" : "mul";
  const char* second = backward ? "mul" : "softmax";
  QG_CHECK(from.size() == 2 && from[0].op->name == first && from[1].op->name == second, ctx.op,
           "fused_from must be {", first, ", ", second, "}, got ", from.size(), " nodes");
  const size_t want = backward ? 3 : 2;
  QG_CHECK(ctx.inputs.size() == want, ctx.op, "takes ", want, " inputs, got ", ctx.inputs.size());
  const Tensor& out = ctx.outputs.at(0);
  for (size_t i = 0; i + 1 < want; ++i) {
    const Tensor& v = ctx.inputs[i];
    QG_CHECK(is_floating(v.dtype()) && v.dtype() == out.dtype() && v.shape() == out.shape() &&
                 v.is_contiguous(),
             ctx.op, "input ", i, " ", v.str(),
             " must be a contiguous float tensor of the output's", " dtype and shape (output ",
             out.str(), ")");
  }
  const Tensor& s = ctx.inputs[want - 1];
  QG_CHECK(s.numel() == 1 && s.dtype() == out.dtype(), ctx.op, "scale ", s.str(),
           " must be one element of the output's dtype (output ", out.str(), ")");
}

void run_scaled_softmax_composed(KernelContext& ctx, DeviceType device) {
  const Tensor& x = ctx.inputs.at(0);
  const std::string op = "fused_scaled_softmax";
  std::vector<Tensor> no_states;
  std::vector<Tensor> scaled = run_original_kernel(
      op, ctx.part(0), device, x.dtype(), mul_operands(ctx, x, ctx.inputs.at(1)),
      {Tensor::empty(x.shape(), x.dtype(), x.device())}, no_states, ctx);
  ctx.outputs = run_original_kernel(op, ctx.part(1), device, x.dtype(), {scaled[0]}, ctx.outputs,
                                    no_states, ctx);
}

void run_scaled_softmax_backward_composed(KernelContext& ctx, DeviceType device) {
  const Tensor& dy = ctx.inputs.at(0);
  const std::string op = "fused_scaled_softmax_backward";
  std::vector<Tensor> no_states;
  std::vector<Tensor> dsm =
      run_original_kernel(op, ctx.part(0), device, dy.dtype(), {dy, ctx.inputs.at(1)},
                          {Tensor::empty(dy.shape(), dy.dtype(), dy.device())}, no_states, ctx);
  ctx.outputs =
      run_original_kernel(op, ctx.part(1), device, dy.dtype(),
                          mul_operands(ctx, dsm[0], ctx.inputs.at(2)), ctx.outputs, no_states, ctx);
}

void define_fused_scaled_softmax_ops(OpRegistry& r) {
  const std::vector<AttrSpec> attrs = {
      int_attr("axis", -1, "the softmax axis (the last one where the pass fused)"),
      int_attr("scale_first", 0, "1 when the scale was the mul's first operand", 0, 1)};

  OpDef& op = r.define("fused_scaled_softmax");
  op.doc =
      "A mul by a one-element scale and the last-axis softmax reading it, fused by the "
      "fuse_scaled_softmax pass: y = softmax(RN(x * scale)).";
  op.inputs = {"x", "scale"};
  op.outputs = {"y"};
  op.attrs = attrs;
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    reject_apply(ctx);
    return {};
  };
  op.is_source = false;
  op.parse_args = parse_softmax_args;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, [](KernelContext& c) {
         check_fused_scaled_softmax_inputs(c);
         run_scaled_softmax_composed(c, DeviceType::cpu);
       }});
  op.fusion_rules = {scaled_softmax_fusion_rule()};

  OpDef& back = r.define("fused_scaled_softmax_backward");
  back.doc =
      "A softmax_backward and the mul of its output by a one-element scale, fused by the "
      "fuse_scaled_softmax pass: dx = RN(softmax_backward(dy, y) * scale).";
  back.inputs = {"dy", "y", "scale"};
  back.outputs = {"dx"};
  back.attrs = attrs;
  back.infer = op.infer;
  back.is_source = false;
  back.parse_args = parse_softmax_args;
  back.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, [](KernelContext& c) {
         check_fused_scaled_softmax_inputs(c);
         run_scaled_softmax_backward_composed(c, DeviceType::cpu);
       }});
}

}  // namespace qg
