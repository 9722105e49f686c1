// fused_observe_quantize(x) -> (y, mask, scale, zero_point): an observer and the quantizer it
// feeds, made into one node by the fuse_observer_quantize pass (observe_quantize_fusion.cpp). The
// node keeps the two original nodes in `fused_from`; its states are the observer's followed by the
// quantizer's. A third fused_from node, when present, is an element-wise activation applied to x
// first (moved in by the fuse_activation_prologue pass, so the activation's output is never
// materialised); kernels run it before anything else.
//
// The generic kernel runs the two original kernels back to back on shared state handles,
// so fused results are bit-identical to the unfused graph by construction; backends may
// register single-pass kernels for specific (observer, quantizer) pairs on top of it.
#include "ops/fused/observe_quantize/observe_quantize.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"
#include "ops/fused/observe_quantize/observe_quantize_fusion.h"

namespace qg {

const std::vector<std::string>& fusible_observers() {
  static const std::vector<std::string> ops = {"minmax_observer", "moving_average_observer"};
  return ops;
}

const std::vector<std::string>& fusible_quantizers() {
  static const std::vector<std::string> ops = {"fake_quantize", "quantize"};
  return ops;
}

const std::vector<std::string>& prologue_activations() {
  static const std::vector<std::string> ops = {"relu", "gelu", "silu"};
  return ops;
}

const Node* prologue_activation(const Node& fused) {
  return fused.fused_from.size() > 2 ? &fused.fused_from[2] : nullptr;
}

const KernelPart* prologue_activation(const PreparedArgs& fused) {
  return fused.parts.size() > 2 ? &fused.parts[2] : nullptr;
}

void apply_prologue(KernelContext& ctx, DeviceType device) {
  const KernelPart* act = prologue_activation(ctx.prepared);
  if (act == nullptr) return;
  const Tensor x = ctx.inputs.at(0);
  std::vector<Tensor> no_states;
  ctx.inputs[0] =
      run_original_kernel("fused_observe_quantize", *act, device, x.dtype(), {x},
                          {Tensor::empty(x.shape(), x.dtype(), x.device())}, no_states, ctx)[0];
}

void run_fused_observe_quantize_composed(KernelContext& ctx, DeviceType device) {
  const KernelPart& observer = ctx.part(0);
  const KernelPart& quantizer = ctx.part(1);
  const Tensor& x = ctx.inputs.at(0);
  size_t n_obs = observer.num_states;
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

std::shared_ptr<const KernelArgs> parse_observe_quantize(const ArgsSource& s) {
  QG_CHECK(s.parts.size() >= 2 && s.inputs.size() == 1, s.op,
           "expects the observer and quantizer it was made of and one input, got ", s.parts.size(),
           " parts and ", s.inputs.size(), " inputs");
  const KernelPart& obs = s.parts[0];
  const KernelPart& q = s.parts[1];
  QG_CHECK(q.op->name == "fake_quantize" || q.op->name == "quantize", s.op,
           "the quantizer part is '", q.op->name, "', not fake_quantize or quantize");
  auto a = std::make_shared<ObserveQuantizeArgs>();
  a->moving_average = obs.op->name == "moving_average_observer";
  a->delayed = obs.attrs.has("delayed") && obs.attrs.get_bool("delayed");
  a->averaging_constant =
      a->moving_average ? static_cast<float>(obs.attrs.get_real("averaging_constant")) : 0.0f;
  a->cfg = qparams_config_from_attrs(obs.op->name, obs.attrs);
  a->range = quant_range_from_attrs(q.op->name, q.attrs);
  a->codes = q.op->name == "quantize";
  a->layout = scope_layout(obs.op->name, obs.attrs, s.inputs[0].shape);
  return a;
}

}  // namespace

void define_fused_observe_quantize_op(OpRegistry& r) {
  OpDef& op = r.define("fused_observe_quantize");
  op.doc = "An observer and the quantizer it feeds, fused by the fuse_observer_quantize pass.";
  op.inputs = {"x"};
  op.outputs = {"y", "mask", "scale", "zero_point"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_observer_quantize pass, not by apply()");
  };
  op.is_source = false;
  op.parse_args = parse_observe_quantize;
  op.kernels.push_back({DeviceType::cpu, {}, fused_observe_quantize_cpu});
  op.fusion_rules = {observe_quantize_fusion_rule(), activation_prologue_fusion_rule()};
}

}  // namespace qg
