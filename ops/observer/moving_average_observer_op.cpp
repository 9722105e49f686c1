// moving_average_observer(x) -> (scale, zero_point): PyTorch's MovingAverageMinMaxObserver
// (scope tensor) and MovingAveragePerChannelMinMaxObserver (scope channel). The first batch
// with finite values sets min/max and the `initialized` flag; later batches move them by
// r = r + c * (batch - r) in f32, c = averaging_constant. A channel whose batch holds no
// finite value keeps its statistics (PyTorch would propagate NaN instead).
// State: min, max (f32), initialized (u8), per channel; nonfinite_count, observer_enabled.
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_defs.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

float averaging_constant(const std::string& op, const Attrs& attrs) {
  double c = attrs.get_real("averaging_constant");
  check_real_in(op, "averaging_constant", c, 0.0, 1.0);
  return static_cast<float>(c);
}

std::vector<TensorType> infer_moving_average(const InferContext& ctx) {
  averaging_constant(ctx.op, ctx.attrs);
  return infer_observer_outputs(ctx);
}

std::vector<StateSpec> moving_average_states(const InferContext& ctx) {
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  std::vector<StateSpec> s = {{"min", {DType::f32, {l.num_qparams}}, 0.0},
                              {"max", {DType::f32, {l.num_qparams}}, 0.0},
                              {"initialized", {DType::u8, {l.num_qparams}}, 0}};
  append_common_states(s);
  return s;
}

// qparams from the running averages; valid once a channel has seen a finite value.
void write_state_qparams(KernelContext& ctx, const float* mn, const float* mx, const uint8_t* init,
                         size_t n) {
  std::vector<float> lo(mn, mn + n), hi(mx, mx + n);
  std::vector<bool> valid(n);
  for (size_t q = 0; q < n; ++q) valid[q] = init[q] != 0;
  write_qparams(ctx, lo, hi, valid);
}

void moving_average_observer_cpu(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  const ScopeLayout& l = args.layout;
  float c = args.averaging_constant;
  CommonStates common = common_states(ctx, 3);
  float* mn = ctx.states[0].data<float>();
  float* mx = ctx.states[1].data<float>();
  uint8_t* init = ctx.states[2].data<uint8_t>();
  size_t n = static_cast<size_t>(l.num_qparams);
  const bool late = args.delayed;
  if (late) write_state_qparams(ctx, mn, mx, init, n);  // the state before this batch
  if (should_update(ctx, common)) {
    std::vector<float> bmin, bmax;
    const int64_t before = *common.nonfinite;
    batch_min_max(ctx.op, ctx.inputs[0], l, common.nonfinite, bmin, bmax);
    if (Communicator* comm = observer_sync(ctx, l)) {  // the global batch's range
      *common.nonfinite =
          before + all_reduce_ranges_and_count(*comm, bmin.data(), bmax.data(),
                                               static_cast<int64_t>(n), *common.nonfinite - before);
    }
    for (size_t q = 0; q < n; ++q) {
      if (!(bmin[q] <= bmax[q])) continue;  // no finite value for this channel
      if (init[q]) {
        mn[q] = obsmath::moving_average(mn[q], bmin[q], c);
        mx[q] = obsmath::moving_average(mx[q], bmax[q], c);
      } else {
        mn[q] = bmin[q];
        mx[q] = bmax[q];
        init[q] = 1;
      }
    }
  }
  if (!late) write_state_qparams(ctx, mn, mx, init, n);
}

}  // namespace

void define_moving_average_observer(OpRegistry& r) {
  OpDef& op = r.define("moving_average_observer");
  op.parse_args = parse_observer_args;
  op.doc =
      "Moving-average min/max observer (PyTorch MovingAverage[PerChannel]MinMaxObserver) "
      "producing (scale, zero_point).";
  op.inputs = {"x"};
  op.outputs = {"scale", "zero_point"};
  op.attrs = observer_attrs({real_attr("averaging_constant", 0.01,
                                       "weight c of the new batch, in (0, 1]; momentum = 1 - c"),
                             delayed_attr()},
                            kAllObserverScopes);
  op.infer = infer_moving_average;
  op.states = moving_average_states;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, moving_average_observer_cpu});
}

}  // namespace qg
