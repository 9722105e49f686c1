// fused_ste_mul_pair(dy, mask, a, b) -> (ya, yb): an ste_backward (the gradient of a
// fake-quantize: dy where the mask bit is set, else +0), the reshape views of its output, and
// the two muls that read it, ya = masked * a and yb = masked * b, each in its mul's operand
// order (attributes a_slot and b_slot: 0 when the masked gradient was the mul's first
// operand). Made by the fuse_ste_mul_pair pass (ste_mul_pair_fusion.cpp): in a Llama block's QAT
// backward, the gradients of both SwiGLU factors are the down projection's masked input
// gradient times the other factor.
//
// The node keeps the original nodes in `fused_from` ({ste_backward, reshape..., mul, mul}).
// The CPU kernel runs their kernels in turn (a reshape is a view of its contiguous input: the
// same elements in the same order), so it is the unfused graph by construction; the CUDA
// kernel evaluates both products of each element in one pass, bit for bit the unfused
// kernels' (ste_mul_pair_cuda.cu).
#include "ops/fused/ste_mul_pair/ste_mul_pair.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/arith/reshape_args.h"
#include "ops/common/bitmask.h"
#include "ops/common/schema_helpers.h"
#include "ops/fused/common/run_original_kernel.h"
#include "ops/fused/ste_mul_pair/ste_mul_pair_args.h"
#include "ops/fused/ste_mul_pair/ste_mul_pair_fusion.h"

namespace qg {

void check_fused_ste_mul_pair(const KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  QG_CHECK(parts >= 3, ctx.op, "fused_from must hold the ste_backward and two muls, got ", parts,
           " nodes");
  QG_CHECK(ctx.part(0).op->name == "ste_backward", ctx.op,
           "the first fused node must be ste_backward, got ", ctx.part(0).op->name);
  for (size_t i = 1; i + 2 < parts; ++i)
    QG_CHECK(ctx.part(i).op->name == "reshape", ctx.op,
             "only reshape views may sit between the ste_backward and the muls, got ",
             ctx.part(i).op->name);
  for (size_t i = parts - 2; i < parts; ++i)
    QG_CHECK(ctx.part(i).op->name == "mul", ctx.op, "the last two fused nodes must be muls, got ",
             ctx.part(i).op->name);
  QG_CHECK(ctx.inputs.size() == 4 && ctx.outputs.size() == 2, ctx.op,
           "takes 4 inputs (dy, mask, a, b) and 2 outputs, got ", ctx.inputs.size(), " and ",
           ctx.outputs.size());
  const Tensor& dy = ctx.inputs[0];
  const Tensor& mask = ctx.inputs[1];
  const Tensor& ya = ctx.outputs[0];
  QG_CHECK(is_floating(dy.dtype()) && dy.numel() == ya.numel() && dy.is_contiguous(), ctx.op, "dy ",
           dy.str(), " must be a contiguous float tensor of ", ya.numel(), " elements (output ",
           ya.str(), ")");
  const int64_t bytes = bitmask_bytes(dy.numel());
  QG_CHECK(mask.dtype() == DType::u8 && mask.numel() == bytes && mask.is_contiguous(), ctx.op,
           "mask ", mask.str(), " must be a contiguous u8 bit mask of ", bytes, " bytes for dy ",
           dy.str());
  for (size_t i = 2; i < 4; ++i) {
    const Tensor& f = ctx.inputs[i];
    const Tensor& y = ctx.outputs[i - 2];
    QG_CHECK(f.dtype() == dy.dtype() && f.shape() == y.shape() && y.dtype() == dy.dtype() &&
                 f.is_contiguous(),
             ctx.op, i == 2 ? "a " : "b ", f.str(), " must be contiguous, of dy's dtype and ",
             "of its product's shape ", y.str(), " (a mul is fused only without broadcasting)");
  }
}

namespace {

void fused_ste_mul_pair_cpu(KernelContext& ctx) {
  check_fused_ste_mul_pair(ctx);
  const std::string op = "fused_ste_mul_pair";
  const Tensor& dy = ctx.inputs[0];
  const size_t parts = ctx.num_parts();
  std::vector<Tensor> no_states;
  Tensor t =
      run_original_kernel(op, ctx.part(0), DeviceType::cpu, dy.dtype(), {dy, ctx.inputs[1]},
                          {Tensor::empty(dy.shape(), dy.dtype(), dy.device())}, no_states, ctx)[0];
  // Each reshape's kernel is this view of its (contiguous) input.
  for (size_t i = 1; i + 2 < parts; ++i) t = t.reshape(ctx.part(i).args<ReshapeArgs>().shape);
  const SteMulPairArgs& args = ctx.args<SteMulPairArgs>();
  for (size_t k = 0; k < 2; ++k) {
    const Tensor& other = ctx.inputs[2 + k];
    std::vector<Tensor> in = (k == 0 ? args.a_first : args.b_first) ? std::vector<Tensor>{t, other}
                                                                    : std::vector<Tensor>{other, t};
    ctx.outputs[k] = run_original_kernel(op, ctx.part(parts - 2 + k), DeviceType::cpu, dy.dtype(),
                                         std::move(in), {ctx.outputs[k]}, no_states, ctx)[0];
  }
}

}  // namespace

void define_fused_ste_mul_pair_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_mul_pair");
  op.doc =
      "An ste_backward and the two muls that read its masked gradient (through reshape views), "
      "fused by the fuse_ste_mul_pair pass: ya = (mask ? dy : +0) * a, yb = (mask ? dy : +0) * "
      "b, each in its mul's operand order.";
  op.inputs = {"dy", "mask", "a", "b"};
  op.outputs = {"ya", "yb"};
  op.attrs = {
      int_attr("a_slot", std::nullopt, "the masked gradient's operand of the first mul", 0, 1),
      int_attr("b_slot", std::nullopt, "the masked gradient's operand of the second mul", 0, 1)};
  op.parse_args = parse_ste_mul_pair_args;
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_mul_pair pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, fused_ste_mul_pair_cpu});
  op.fusion_rules = {ste_mul_pair_fusion_rule()};
}

}  // namespace qg
