// fused_channel_div_batch_norm and its backward: the output rescaling of a folded conv-bn
// block (channel_div, y = x / s[c]) and the batch_norm that reads it, made into one node each
// by the fuse_channel_div_batch_norm pass (channel_div_bn_fusion.cpp).
//   fused_channel_div_batch_norm           {x, s, gamma, beta, running_mean, running_var}
//                                          -> {y, save_mean, save_invstd, used_batch_stats}
//   fused_channel_div_batch_norm_backward  {dy, x, s, gamma, save_mean, save_invstd,
//                                           used_batch_stats} -> {dx, ds, dgamma, dbeta}
// x is the conv output before the division. Unfused, x / s is a full activation written by
// channel_div, read twice by batch_norm and once by each backward op; the fused nodes form
// x / s where they read x, so the quotient never exists as a graph value.
//
// The forward node keeps the batch norm's name and `frozen` state (checkpoints key states by
// node name, freeze_bn_stats sets that flag), and updates the running statistics in place
// like batch_norm. fused_from holds the originals: {channel_div, batch_norm} and
// {channel_div, batch_norm_backward, channel_div_backward}. The CPU kernels run their
// kernels back to back (the backward recomputes x / s with channel_div's kernel), so they
// are the unfused graph bit for bit by construction; the CUDA kernels
// (ops/norm/channel_div_bn_cuda.cu) are bit-identical to the unfused CUDA kernels.
#include "ops/fused/channel_div_bn/channel_div_bn.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/channel_div_bn/channel_div_bn_fusion.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {
namespace {

const char kForward[] = "fused_channel_div_batch_norm";
const char kBackward[] = "fused_channel_div_batch_norm_backward";

// in[first..last] are [C] vectors of `x`'s dtype (C = x's axis 1).
void expect_channel_vectors(const char* op, const std::vector<TensorType>& in, size_t x,
                            size_t first, size_t last) {
  const TensorType& xt = in[x];
  for (size_t i = first; i <= last; ++i)
    QG_CHECK(in[i].dtype == xt.dtype && in[i].shape == Shape{xt.shape[1]}, op, "input ", i,
             " must be ", dtype_name(xt.dtype), "[", xt.shape[1],
             "] (one value per channel of axis 1), got ", in[i].str(), " for x ", xt.str());
}

void expect_float_nc(const char* op, const std::vector<TensorType>& in, size_t arity, size_t x) {
  QG_CHECK(in.size() == arity, op, "expects ", arity, " inputs, got ", in.size());
  const TensorType& xt = in[x];
  QG_CHECK(xt.dtype == DType::f32 || xt.dtype == DType::f64, op, "x must be f32 or f64, got ",
           xt.str());
  QG_CHECK(xt.shape.size() >= 2, op, "x must be [N, C, ...] (rank >= 2, channels on axis 1), got ",
           xt.str());
}

void fused_forward_cpu(KernelContext& ctx) {
  const KernelPart& div = ctx.part(0);
  const KernelPart& bn = ctx.part(1);
  const Tensor& x = ctx.inputs.at(0);
  std::vector<Tensor> no_states;
  std::vector<Tensor> q =
      run_original_kernel(kForward, div, DeviceType::cpu, x.dtype(), {x, ctx.inputs.at(1)},
                          {Tensor::empty(x.shape(), x.dtype(), x.device())}, no_states, ctx);
  // The fused node's states are the batch norm's (its `frozen` flag).
  ctx.outputs = run_original_kernel(
      kForward, bn, DeviceType::cpu, x.dtype(),
      {q[0], ctx.inputs.at(2), ctx.inputs.at(3), ctx.inputs.at(4), ctx.inputs.at(5)}, ctx.outputs,
      ctx.states, ctx);
}

void fused_backward_cpu(KernelContext& ctx) {
  const KernelPart& div = ctx.part(0);
  const KernelPart& bn_back = ctx.part(1);
  const KernelPart& div_back = ctx.part(2);
  const Tensor& dy = ctx.inputs.at(0);
  const Tensor& x = ctx.inputs.at(1);
  const Tensor& s = ctx.inputs.at(2);
  const DType t = x.dtype();
  std::vector<Tensor> no_states;
  std::vector<Tensor> q =
      run_original_kernel(kBackward, div, DeviceType::cpu, t, {x, s},
                          {Tensor::empty(x.shape(), t, x.device())}, no_states, ctx);
  std::vector<Tensor> bn = run_original_kernel(
      kBackward, bn_back, DeviceType::cpu, t,
      {dy, q[0], ctx.inputs.at(3), ctx.inputs.at(4), ctx.inputs.at(5), ctx.inputs.at(6)},
      {Tensor::empty(x.shape(), t, x.device()), ctx.outputs.at(2), ctx.outputs.at(3)}, no_states,
      ctx);
  std::vector<Tensor> d =
      run_original_kernel(kBackward, div_back, DeviceType::cpu, t, {bn[0], q[0], s},
                          {ctx.outputs.at(0), ctx.outputs.at(1)}, no_states, ctx);
  ctx.outputs = {d[0], d[1], bn[1], bn[2]};
}

}  // namespace

std::vector<TensorType> fused_channel_div_batch_norm_types(const std::vector<TensorType>& in) {
  expect_float_nc(kForward, in, 6, 0);
  expect_channel_vectors(kForward, in, 0, 1, 5);
  const TensorType& x = in[0];
  const TensorType stats{x.dtype, {x.shape[1]}};
  return {x, stats, stats, {x.dtype, {1}}};
}

std::vector<TensorType> fused_channel_div_batch_norm_backward_types(
    const std::vector<TensorType>& in) {
  expect_float_nc(kBackward, in, 7, 1);
  const TensorType& x = in[1];
  QG_CHECK(in[0] == x, kBackward, "dy ", in[0].str(), " must match x ", x.str());
  expect_channel_vectors(kBackward, in, 1, 2, 5);
  QG_CHECK(in[6] == (TensorType{x.dtype, {1}}), kBackward,
           "used_batch_stats must be a one-element ", dtype_name(x.dtype), " tensor, got ",
           in[6].str());
  const TensorType stats{x.dtype, {x.shape[1]}};
  return {x, stats, stats, stats};
}

void define_fused_channel_div_bn_ops(OpRegistry& r) {
  OpDef& op = r.define(kForward);
  op.doc =
      "channel_div (y = x / s[c]) and the batch_norm that reads it, fused by the "
      "fuse_channel_div_batch_norm pass; the batch norm's running statistics and frozen state.";
  op.inputs = {"x", "s", "gamma", "beta", "running_mean", "running_var"};
  op.outputs = {"y", "save_mean", "save_invstd", "used_batch_stats"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op,
            "fused nodes are created by the fuse_channel_div_batch_norm pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, {DType::f32, DType::f64}, fused_forward_cpu});
  op.fusion_rules = {channel_div_bn_fusion_rule()};

  OpDef& back = r.define(kBackward);
  back.doc =
      "batch_norm_backward and the channel_div_backward that reads its dx, fused by the "
      "fuse_channel_div_batch_norm pass; x is channel_div's input (the quotient is recomputed).";
  back.inputs = {"dy", "x", "s", "gamma", "save_mean", "save_invstd", "used_batch_stats"};
  back.outputs = {"dx", "ds", "dgamma", "dbeta"};
  back.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op,
            "fused nodes are created by the fuse_channel_div_batch_norm pass, not by apply()");
  };
  back.is_source = false;
  back.kernels.push_back({DeviceType::cpu, {DType::f32, DType::f64}, fused_backward_cpu});
}

}  // namespace qg
