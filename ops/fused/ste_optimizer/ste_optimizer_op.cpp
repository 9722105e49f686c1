// fused_ste_optimizer(param, dy, mask): an ste_backward (the gradient of a weight's
// fake-quantize: dy where the mask bit is set, else +0) and the sgd or adam step that is its
// only reader, made into one node by the fuse_ste_optimizer pass (ste_optimizer_fusion.cpp). The
// unfused backward writes the masked weight gradient and the step reads it straight back; the
// fused node reads dy and the mask bits and updates the parameter in the same pass.
//
// The mask was computed by the forward fake-quantize from the weight as it was before this
// step, so the fused node reads no weight value for it; the update reads each element of the
// parameter before writing it, as the plain step does. The pass rewrites the step node in
// place, so the node keeps its id (callers hold it as a run target), its name and states
// (checkpoints match the unfused graph) and its control dependencies (it still runs after
// every reader of the old parameter).
//
// Kernels: ops/optim/optim_cpu.h and optim_cuda.cuh hold the plain steps' per-element update,
// parameterised by where element i's gradient comes from; the fused kernels are that same code
// with `mask bit i ? dy[i] : +0` (ste_backward's select) as the gradient, so every float
// operation is the unfused graph's, in the same order, and the result is bit-identical.
#include "ops/fused/ste_optimizer/ste_optimizer.h"

#include <algorithm>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/bitmask.h"
#include "ops/fused/ste_optimizer/ste_optimizer_fusion.h"
#include "ops/optim/optim_cpu.h"

namespace qg {

void check_fused_ste_optimizer_inputs(const KernelContext& ctx) {
  const KernelPart& step = ctx.part(1);
  const auto& ok = ste_fusible_optimizers();
  QG_CHECK(std::find(ok.begin(), ok.end(), step.op->name) != ok.end(), ctx.op, "fused step '",
           step.op->name, "' is not one of sgd, adam");
  const Tensor& p = ctx.inputs.at(0);
  const Tensor& dy = ctx.inputs.at(1);
  const Tensor& mask = ctx.inputs.at(2);
  QG_CHECK(dy.dtype() == p.dtype() && dy.shape() == p.shape(), ctx.op, "dy ", dy.str(),
           " must match param ", p.str());
  QG_CHECK(mask.dtype() == DType::u8 && mask.numel() == bitmask_bytes(p.numel()), ctx.op, "mask ",
           mask.str(), " must hold ", bitmask_bytes(p.numel()), " bytes for param ", p.str());
  QG_CHECK(mask.is_contiguous(), ctx.op, "mask must be contiguous");
}

namespace {

template <typename T>
void fused_ste_optimizer_typed(KernelContext& ctx) {
  const KernelPart& step = ctx.part(1);
  const T* dy = ctx.inputs[1].data<T>();
  const uint8_t* mask = ctx.inputs[2].data<uint8_t>();
  // ste_backward's element: dy's value where the bit is set, else +0 (fq_simd::ste_backward
  // writes exactly these bits).
  auto masked = [dy, mask](int64_t i) { return bitmask_get(mask, i) ? dy[i] : T(0); };
  if (step.op->name == "sgd")
    sgd_update<T>(ctx, step.args<SgdArgs>(), ctx.inputs[1], masked);
  else
    adam_update<T>(ctx, step.args<AdamArgs>(), ctx.inputs[1], masked);
}

void fused_ste_optimizer_cpu(KernelContext& ctx) {
  check_fused_ste_optimizer_inputs(ctx);
  const DType t = ctx.inputs[0].dtype();
  QG_CHECK(t == DType::f32 || t == DType::f64, ctx.op, "param must be f32 or f64, got ",
           ctx.inputs[0].str());
  if (t == DType::f64)
    fused_ste_optimizer_typed<double>(ctx);
  else
    fused_ste_optimizer_typed<float>(ctx);
}

}  // namespace

const std::vector<std::string>& ste_fusible_optimizers() {
  static const std::vector<std::string> ops = {"sgd", "adam"};
  return ops;
}

void define_fused_ste_optimizer_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_optimizer");
  op.doc =
      "An ste_backward and the sgd or adam step that is its only reader, fused by the "
      "fuse_ste_optimizer pass: the step with grad = mask ? dy : +0; updates param in place.";
  op.inputs = {"param", "dy", "mask"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_optimizer pass, not by apply()");
  };
  op.is_source = false;
  op.side_effects = true;
  op.kernels.push_back({DeviceType::cpu, {DType::f32, DType::f64}, fused_ste_optimizer_cpu});
  op.fusion_rules = {ste_optimizer_fusion_rule()};
}

}  // namespace qg
