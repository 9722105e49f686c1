// percentile_observer(x) -> (scale, zero_point, range_min, range_max): the range comes from
// percentiles of a histogram accumulated over every batch (percentile_histogram.h):
// symmetric: amax = the p-th percentile of |x|, range [-amax, amax];
// affine: range [(100 - p)-th, p-th] percentile of x.
// Target masses, in f64: q_hi = p / 100 * total, q_lo = (100 - p) / 100 * total. The f64
// range is rounded to f32 and turned into qparams like every observer. Deterministic: the
// counts are integers and the range growth depends only on the batches' extremes.
// State: histogram [C, bins] i64, lo, width (f64), initialized (u8) per channel;
// nonfinite_count, observer_enabled.
#include <algorithm>
#include <cmath>

#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_defs.h"
#include "ops/observer/percentile_histogram.h"

namespace qg {
namespace {

double percentile_attr(const std::string& op, const Attrs& attrs) {
  double p = attrs.get_real("percentile");
  check_real_in(op, "percentile", p, 0.0, 100.0);
  return p;
}

std::vector<TensorType> infer_percentile(const InferContext& ctx) {
  percentile_attr(ctx.op, ctx.attrs);
  std::vector<TensorType> out = infer_observer_outputs(ctx);
  out.push_back(out[0]);
  out.push_back(out[0]);
  return out;
}

std::vector<StateSpec> percentile_states(const InferContext& ctx) {
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  const int64_t c = l.num_qparams, bins = ctx.attrs.get_int("bins");
  std::vector<StateSpec> s = {{"histogram", {DType::i64, {c, bins}}, 0.0},
                              {"lo", {DType::f64, {c}}, 0.0},
                              {"width", {DType::f64, {c}}, 0.0},
                              {"initialized", {DType::u8, {c}}, 0}};
  append_common_states(s);
  return s;
}

void percentile_observer_cpu(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  const ScopeLayout& l = args.layout;
  const int64_t bins = args.bins;
  const double p = args.percentile;
  const bool symmetric = args.symmetric;
  CommonStates common = common_states(ctx, 4);
  const size_t n = static_cast<size_t>(l.num_qparams);
  auto channel = [&](size_t q) {
    PercentileHistogram h;
    h.counts = ctx.states[0].data<int64_t>() + static_cast<int64_t>(q) * bins;
    h.lo = ctx.states[1].data<double>() + q;
    h.width = ctx.states[2].data<double>() + q;
    h.initialized = ctx.states[3].data<uint8_t>() + q;
    h.bins = bins;
    return h;
  };
  if (should_update(ctx, common)) {
    const int64_t before = *common.nonfinite;
    std::vector<std::vector<float>> values =
        gather_finite(ctx.op, ctx.inputs[0], l, common.nonfinite);
    if (Communicator* comm = observer_sync(ctx, l)) {  // the global batch, in rank order
      sync_values(*comm, values);
      sync_nonfinite(*comm, common.nonfinite, before);
    }
    for (size_t q = 0; q < n; ++q) {
      if (symmetric)
        for (float& v : values[q]) v = std::fabs(v);
      percentile_histogram_update(channel(q), values[q]);
    }
  }
  std::vector<float> lo(n, 0.0f), hi(n, 0.0f);
  std::vector<bool> valid(n);
  for (size_t q = 0; q < n; ++q) {
    PercentileHistogram h = channel(q);
    valid[q] = *h.initialized != 0;
    if (valid[q]) {
      const double total = static_cast<double>(percentile_histogram_total(h));
      double top = percentile_histogram_value(h, p / 100.0 * total);
      double bottom = symmetric ? -top : percentile_histogram_value(h, (100.0 - p) / 100.0 * total);
      // p < 50 puts the "lower" percentile above the upper one; the range is their hull.
      lo[q] = static_cast<float>(std::min(bottom, top));
      hi[q] = static_cast<float>(std::max(bottom, top));
    }
    ctx.outputs[2].data<float>()[q] = lo[q];
    ctx.outputs[3].data<float>()[q] = hi[q];
  }
  write_qparams(ctx, lo, hi, valid);
}

}  // namespace

void define_percentile_observer(OpRegistry& r) {
  OpDef& op = r.define("percentile_observer");
  op.parse_args = parse_observer_args;
  op.doc =
      "Percentile observer: range from the p-th percentile of |x| (symmetric) or the "
      "(100-p, p) percentiles (affine) of a histogram accumulated across batches.";
  op.inputs = {"x"};
  op.outputs = {"scale", "zero_point", "range_min", "range_max"};
  op.attrs = observer_attrs(
      {real_attr("percentile", 99.99, "p in (0, 100]"),
       int_attr("bins", 2048, "histogram bins per channel (2..2^20)", 2, int64_t{1} << 20)});
  op.infer = infer_percentile;
  op.states = percentile_states;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, percentile_observer_cpu});
}

}  // namespace qg
