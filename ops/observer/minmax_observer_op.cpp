// minmax_observer(x) -> (scale, zero_point): a stateful node keeping the running min and max
// of every finite value seen (per tensor, channel, token or group), and turning them into
// qparams exactly as PyTorch's MinMaxObserver / PerChannelMinMaxObserver do.
// State: min, max (f32, +inf/-inf until a finite value arrives), nonfinite_count (i64),
// observer_enabled (u8). Statistics update only in training mode with the flag set.
#include <limits>

#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_defs.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

std::vector<StateSpec> minmax_states(const InferContext& ctx) {
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<StateSpec> s = {{"min", {DType::f32, {l.num_qparams}}, inf},
                              {"max", {DType::f32, {l.num_qparams}}, -inf}};
  append_common_states(s);
  return s;
}

// qparams from the running range; valid once a finite value has been seen.
void write_range_qparams(KernelContext& ctx, const float* mn, const float* mx, size_t n) {
  std::vector<float> lo(mn, mn + n), hi(mx, mx + n);
  std::vector<bool> valid(n);
  for (size_t q = 0; q < n; ++q) valid[q] = lo[q] <= hi[q];
  write_qparams(ctx, lo, hi, valid);
}

void minmax_observer_cpu(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  const ScopeLayout& l = args.layout;
  CommonStates common = common_states(ctx, 2);
  float* mn = ctx.states[0].data<float>();
  float* mx = ctx.states[1].data<float>();
  size_t n = static_cast<size_t>(l.num_qparams);
  const bool late = args.delayed;
  if (late) write_range_qparams(ctx, mn, mx, n);  // the state before this batch
  if (should_update(ctx, common)) {
    // min/max are order-independent, so updating in place is deterministic.
    const int64_t before = *common.nonfinite;
    fold_finite_range(ctx.op, ctx.inputs[0], l, common.nonfinite, mn, mx);
    // Every rank entered with the same state, so the MIN/MAX of the folded states is the
    // state folded with every shard.
    if (Communicator* comm = observer_sync(ctx, l)) {
      *common.nonfinite =
          before + all_reduce_ranges_and_count(*comm, mn, mx, static_cast<int64_t>(n),
                                               *common.nonfinite - before);
    }
  }
  if (!late) write_range_qparams(ctx, mn, mx, n);
}

}  // namespace

void define_minmax_observer(OpRegistry& r) {
  OpDef& op = r.define("minmax_observer");
  op.parse_args = parse_observer_args;
  op.doc = "Running min/max observer producing (scale, zero_point) as PyTorch's MinMaxObserver.";
  op.inputs = {"x"};
  op.outputs = {"scale", "zero_point"};
  op.attrs = observer_attrs({delayed_attr()}, kAllObserverScopes);
  op.infer = infer_observer_outputs;
  op.states = minmax_states;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, minmax_observer_cpu});
}

}  // namespace qg
