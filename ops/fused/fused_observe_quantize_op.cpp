// fused_observe_quantize(x) -> (y, mask, scale, zero_point): an observer and the quantizer it
// feeds, made into one node by the fusion pass (runtime/passes). The node keeps the two
// original nodes in `fused_from`; its states are the observer's followed by the quantizer's.
//
// The generic kernel runs the two original kernels back to back on shared state handles,
// so fused results are bit-identical to the unfused graph by construction; backends may
// register single-pass kernels for specific (observer, quantizer) pairs on top of it.
#include "ops/fused/fused_observe_quantize.h"
#include "ops/fused/fused_ste_backward.h"

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

void run_fused_observe_quantize_composed(KernelContext& ctx, DeviceType device) {
  const Node& observer = ctx.node.fused_from.at(0);
  const Node& quantizer = ctx.node.fused_from.at(1);
  const Tensor& x = ctx.inputs.at(0);
  size_t n_obs = observer.states.size();
  std::vector<Tensor> obs_states(ctx.states.begin(), ctx.states.begin() + n_obs);
  std::vector<Tensor> q_states(ctx.states.begin() + n_obs, ctx.states.end());

  KernelContext obs{
      observer.op->name, observer,     observer.attrs, {x},    {ctx.outputs[2], ctx.outputs[3]},
      obs_states,        ctx.training, ctx.stream,     nullptr};
  const KernelDef* ok = observer.op->find_kernel(device, x.dtype());
  QG_CHECK(ok != nullptr, "fused_observe_quantize", "no ", device_type_name(device), " kernel for ",
           observer.op->name, " on ", dtype_name(x.dtype()));
  ok->fn(obs);

  KernelContext q{quantizer.op->name,
                  quantizer,
                  quantizer.attrs,
                  {x, obs.outputs[0], obs.outputs[1]},
                  {ctx.outputs[0], ctx.outputs[1]},
                  q_states,
                  ctx.training,
                  ctx.stream,
                  nullptr};
  const KernelDef* qk = quantizer.op->find_kernel(device, x.dtype());
  QG_CHECK(qk != nullptr, "fused_observe_quantize", "no ", device_type_name(device), " kernel for ",
           quantizer.op->name, " on ", dtype_name(x.dtype()));
  qk->fn(q);
  ctx.outputs = {q.outputs[0], q.outputs[1], obs.outputs[0], obs.outputs[1]};
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
}

}  // namespace qg
