// fused_ste_producer(a, mask[, b]) -> dx: an element-wise producer of a gradient and the
// ste_backward (the gradient of an activation fake-quantizer: dy where the mask bit is set,
// else +0) that reads it, possibly through reshape views, made into one node by the
// fuse_ste_producer pass (ste_producer_fusion.cpp). In the transformer's QAT step the gradients of
// the q, k and v projections' quantized outputs come out of the backward of the attention
// head split (a permute, then a reshape view), and the gradient of the quantized ln1 output is
// the sum of the three projections' input gradients (an add): the unfused backward writes the
// gradient and reads it straight back to mask it. The fused node writes only the masked one.
//
// Inputs: a (the permute's or transpose's x, or the add's a), mask (the ste_backward's), and
// b (the add's b; add only). The float input comes first: the executor picks a node's kernel
// by its first input's dtype.
//
// The node keeps the original nodes in `fused_from` ({producer, reshape..., ste_backward}).
// The CPU kernel runs the producer's and the ste_backward's kernels back to back (a reshape
// is a view of the contiguous producer output: the same elements in the same order), so it
// is the unfused graph by construction; the CUDA kernel computes each producer element and
// keeps it or writes +0 by the mask bit of its (flat) output index, in one pass.
#include "ops/fused/ste_producer/ste_producer.h"

#include <algorithm>

#include "core/error.h"
#include "core/graph.h"
#include "ops/arith/reshape_args.h"
#include "ops/common/bitmask.h"
#include "ops/fused/common/run_original_kernel.h"
#include "ops/fused/ste_producer/ste_producer_fusion.h"
#include "ops/shape/permute_plan.h"

namespace qg {

const std::vector<std::string>& ste_fusible_producers() {
  static const std::vector<std::string> ops = {"permute", "transpose", "add"};
  return ops;
}

void check_fused_ste_producer_inputs(const KernelContext& ctx) {
  const std::vector<KernelPart>& from = ctx.prepared.parts;
  QG_CHECK(from.size() >= 2, ctx.op, "fused_from must hold the producer and the ste_backward, got ",
           from.size(), " nodes");
  const std::string& producer = from.front().op->name;
  const auto& ok = ste_fusible_producers();
  QG_CHECK(std::find(ok.begin(), ok.end(), producer) != ok.end(), ctx.op, "the producer ", producer,
           " is not one of permute, transpose, add");
  QG_CHECK(from.back().op->name == "ste_backward", ctx.op,
           "the last fused node must be ste_backward, got ", from.back().op->name);
  for (size_t i = 1; i + 1 < from.size(); ++i)
    QG_CHECK(from[i].op->name == "reshape", ctx.op,
             "only reshape views may sit between the producer and the ste_backward, got ",
             from[i].op->name);
  const bool add = producer == "add";
  const size_t want = add ? 3 : 2;
  QG_CHECK(ctx.inputs.size() == want, ctx.op, "a fused ", producer, " takes ", want,
           add ? " inputs (a, mask, b)" : " inputs (a, mask)", ", got ", ctx.inputs.size());
  const Tensor& a = ctx.inputs[0];
  const Tensor& mask = ctx.inputs[1];
  const Tensor& dx = ctx.outputs.at(0);
  QG_CHECK(is_floating(a.dtype()) && a.dtype() == dx.dtype() && a.numel() == dx.numel() &&
               a.is_contiguous(),
           ctx.op, "a ", a.str(), " must be a contiguous float tensor of the output's dtype and ",
           dx.numel(), " elements (output ", dx.str(), ")");
  const int64_t bytes = bitmask_bytes(dx.numel());
  QG_CHECK(mask.dtype() == DType::u8 && mask.numel() == bytes && mask.is_contiguous(), ctx.op,
           "mask ", mask.str(), " must be a contiguous u8 bit mask of ", bytes,
           " bytes for the output ", dx.str());
  if (add) {
    const Tensor& b = ctx.inputs[2];
    QG_CHECK(b.dtype() == a.dtype() && b.shape() == a.shape() && b.is_contiguous(), ctx.op, "b ",
             b.str(), " must be contiguous with a's dtype and shape ", a.str(),
             " (an add is fused only without broadcasting)");
  }
}

namespace {

// The producer's output shape (the fused node never forms that value, only its masked copy).
Shape producer_shape(const KernelPart& producer, const Tensor& a) {
  if (producer.op->name == "add") return a.shape();
  const std::vector<int64_t>& perm = producer.args<PermuteArgs>().perm;
  Shape out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[i] = a.shape()[perm[i]];
  return out;
}

void fused_ste_producer_cpu(KernelContext& ctx) {
  check_fused_ste_producer_inputs(ctx);
  const std::string op = "fused_ste_producer";
  const std::vector<KernelPart>& from = ctx.prepared.parts;
  const Tensor& a = ctx.inputs[0];
  std::vector<Tensor> in = {a};
  if (from.front().op->name == "add") in.push_back(ctx.inputs[2]);
  std::vector<Tensor> no_states;
  Tensor t = run_original_kernel(op, from.front(), DeviceType::cpu, a.dtype(), in,
                                 {Tensor::empty(producer_shape(from.front(), a), a.dtype())},
                                 no_states, ctx)[0];
  // Each reshape's kernel is this view of its (contiguous) input.
  for (size_t i = 1; i + 1 < from.size(); ++i) t = t.reshape(from[i].args<ReshapeArgs>().shape);
  ctx.outputs = run_original_kernel(op, from.back(), DeviceType::cpu, a.dtype(), {t, ctx.inputs[1]},
                                    ctx.outputs, no_states, ctx);
}

}  // namespace

void define_fused_ste_producer_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_producer");
  op.doc =
      "An element-wise producer (permute, transpose or same-shape add) and the ste_backward "
      "that reads its output (through reshape views), fused by the fuse_ste_producer pass: "
      "dx = mask ? producer(a[, b]) : +0.";
  op.inputs = {"a", "mask", "b"};
  op.outputs = {"dx"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_producer pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, fused_ste_producer_cpu});
  op.fusion_rules = {ste_producer_fusion_rule()};
}

}  // namespace qg
