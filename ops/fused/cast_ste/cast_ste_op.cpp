// fused_cast_ste(dy, mask) -> dx (f32): dx = f32(dy) where the mask bit is set, else +0. Made
// by the fuse_cast_ste pass from a widening cast (bf16/f16 -> f32) and the ste_backward that
// reads it. A bf16 mixed-precision QAT step has one for every fake-quantized f32 weight: the
// weight's gradient comes out of a bf16 GEMM, is widened (the backward of the weight's cast to
// the GEMM's dtype), then masked by the weight quantizer's straight-through estimator. The
// unfused graph writes the widened copy and reads it back; the fused node reads the 2-byte
// gradient once. The CPU kernel runs the cast's and the ste_backward's own kernels back to
// back, so it is the unfused graph by construction; the CUDA kernel widens exactly (NaN
// payloads kept) and writes +0 where the bit is clear, as ste_backward does.
#include "ops/fused/cast_ste/cast_ste.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/bitmask.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {

void check_fused_cast_ste_inputs(const KernelContext& ctx) {
  QG_CHECK(ctx.inputs.size() == 2 && ctx.outputs.size() == 1, ctx.op,
           "takes inputs {dy, mask} and output {dx}, got ", ctx.inputs.size(), " inputs and ",
           ctx.outputs.size(), " outputs");
  const Tensor &dy = ctx.inputs[0], &mask = ctx.inputs[1], &dx = ctx.outputs[0];
  QG_CHECK((dy.dtype() == DType::bf16 || dy.dtype() == DType::f16) && dy.is_contiguous(), ctx.op,
           "dy ", dy.str(), " must be a contiguous bf16 or f16 tensor");
  QG_CHECK(dx.dtype() == DType::f32 && dx.numel() == dy.numel() && dx.is_contiguous(), ctx.op,
           "dx ", dx.str(), " must be a contiguous f32 tensor of dy's ", dy.numel(), " elements");
  const int64_t bytes = bitmask_bytes(dy.numel());
  QG_CHECK(mask.dtype() == DType::u8 && mask.numel() == bytes && mask.is_contiguous(), ctx.op,
           "mask ", mask.str(), " must be a contiguous u8 bit mask of ", bytes, " bytes for dy ",
           dy.str());
}

namespace {

void fused_cast_ste_cpu(KernelContext& ctx) {
  check_fused_cast_ste_inputs(ctx);
  QG_CHECK(ctx.num_parts() == 2 && ctx.part(0).op->name == "cast" &&
               ctx.part(1).op->name == "ste_backward",
           ctx.op, "fused_from must be {cast, ste_backward}");
  std::vector<Tensor> no_states;
  const Tensor& dy = ctx.inputs[0];
  Tensor wide = run_original_kernel(ctx.op, ctx.part(0), DeviceType::cpu, dy.dtype(), {dy},
                                    {Tensor::empty(dy.shape(), DType::f32)}, no_states, ctx)[0];
  wide = wide.reshape(ctx.outputs[0].shape());
  ctx.outputs = run_original_kernel(ctx.op, ctx.part(1), DeviceType::cpu, DType::f32,
                                    {wide, ctx.inputs[1]}, ctx.outputs, no_states, ctx);
}

}  // namespace

void define_fused_cast_ste_op(OpRegistry& r) {
  OpDef& op = r.define("fused_cast_ste");
  op.doc =
      "A widening cast (bf16/f16 -> f32) and the ste_backward that reads it, fused by the "
      "fuse_cast_ste pass: dx = mask ? f32(dy) : +0.";
  op.inputs = {"dy", "mask"};
  op.outputs = {"dx"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_cast_ste pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, {DType::f16, DType::bf16}, fused_cast_ste_cpu});
  op.fusion_rules = {cast_ste_fusion_rule()};
}

}  // namespace qg
