// fused_observe_quantize(x) -> (y, mask, scale, zero_point): an observer and the quantizer it
// feeds, made into one node by the fusion pass (runtime/passes). The node keeps the two
// original nodes in `fused_from`; its states are the observer's followed by the quantizer's.
// A third fused_from node, when present, is an element-wise activation applied to x first
// (moved in by the fuse_activation_prologue pass, so the activation's output is never
// materialised); kernels run it before anything else.
//
// The generic kernel runs the two original kernels back to back on shared state handles,
// so fused results are bit-identical to the unfused graph by construction; backends may
// register single-pass kernels for specific (observer, quantizer) pairs on top of it.
#include "ops/fused/fused_channel_div_bn.h"
#include "ops/fused/fused_observe_quantize.h"
#include "ops/fused/fused_scaled_softmax.h"
#include "ops/fused/fused_ste_backward.h"
#include "ops/fused/fused_ste_optimizer.h"
#include "ops/fused/fused_ste_producer.h"

#include <atomic>

#include "core/error.h"
#include "core/graph.h"

namespace qg {

const std::vector<std::string>& fusible_observers() {
  static const std::vector<std::string> ops = {"minmax_observer", "moving_average_observer"};
  return ops;
}

const std::vector<std::string>& fusible_quantizers() {
  static const std::vector<std::string> ops = {"fake_quantize", "quantize"};
  return ops;
}

std::vector<Tensor> run_original_kernel(const std::string& fused_op, const Node& original,
                                        DeviceType device, DType dtype, std::vector<Tensor> inputs,
                                        std::vector<Tensor> outputs, std::vector<Tensor>& states,
                                        const KernelContext& fused) {
  const KernelDef* k = original.op->find_kernel(device, dtype);
  QG_CHECK(k != nullptr, fused_op, "no ", device_type_name(device), " kernel for ",
           original.op->name, " on ", dtype_name(dtype));
  KernelContext c{original.op->name, original,           original.attrs,
                  std::move(inputs), std::move(outputs), states,
                  fused.training,    fused.device,       nullptr};
  k->fn(c);
  return c.outputs;
}

const std::vector<std::string>& prologue_activations() {
  static const std::vector<std::string> ops = {"relu", "gelu", "silu"};
  return ops;
}

const Node* prologue_activation(const Node& fused) {
  return fused.fused_from.size() > 2 ? &fused.fused_from[2] : nullptr;
}

void apply_prologue(KernelContext& ctx, DeviceType device) {
  const Node* act = prologue_activation(ctx.node);
  if (act == nullptr) return;
  const Tensor x = ctx.inputs.at(0);
  std::vector<Tensor> no_states;
  ctx.inputs[0] =
      run_original_kernel("fused_observe_quantize", *act, device, x.dtype(), {x},
                          {Tensor::empty(x.shape(), x.dtype(), x.device())}, no_states, ctx)[0];
}

void run_fused_observe_quantize_composed(KernelContext& ctx, DeviceType device) {
  const Node& observer = ctx.node.fused_from.at(0);
  const Node& quantizer = ctx.node.fused_from.at(1);
  const Tensor& x = ctx.inputs.at(0);
  size_t n_obs = observer.states.size();
  std::vector<Tensor> obs_states(ctx.states.begin(), ctx.states.begin() + n_obs);
  std::vector<Tensor> q_states(ctx.states.begin() + n_obs, ctx.states.end());
  const std::string op = "fused_observe_quantize";
  std::vector<Tensor> qp = run_original_kernel(op, observer, device, x.dtype(), {x},
                                               {ctx.outputs[2], ctx.outputs[3]}, obs_states, ctx);
  std::vector<Tensor> yq = run_original_kernel(op, quantizer, device, x.dtype(), {x, qp[0], qp[1]},
                                               {ctx.outputs[0], ctx.outputs[1]}, q_states, ctx);
  ctx.outputs = {yq[0], yq[1], qp[0], qp[1]};
}

namespace {
std::atomic<int64_t> middle_rows_launches{0}, middle_channels_launches{0};
}  // namespace

MiddleMapLaunches fused_middle_map_launches() {
  return {middle_rows_launches.load(), middle_channels_launches.load()};
}

void count_fused_middle_map_launch(bool channel_major) {
  (channel_major ? middle_channels_launches : middle_rows_launches).fetch_add(1);
}

void define_fused_ops(OpRegistry& r) {
  OpDef& op = r.define("fused_observe_quantize");
  op.doc = "An observer and the quantizer it feeds, fused by the fuse_observer_quantize pass.";
  op.inputs = {"x"};
  op.outputs = {"y", "mask", "scale", "zero_point"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_observer_quantize pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, {}, fused_observe_quantize_cpu});
  define_fused_ste_backward_op(r);
  define_fused_channel_div_bn_ops(r);
  define_fused_ste_optimizer_op(r);
  define_fused_ste_chain_op(r);
  define_fused_ste_producer_op(r);
  define_fused_scaled_softmax_ops(r);
}

}  // namespace qg
