// histogram_observer(x) -> (scale, zero_point, range_min, range_max): PyTorch's
// HistogramObserver (see torch_histogram.h), per tensor or with one histogram per channel.
// range_min/range_max expose the clipping range the L2 search picked (what the qparams are
// computed from) for inspection and conformance. dst_nbins = 2^bits, as PyTorch takes
// 2^(bits of the quantized dtype) whatever quant_min/quant_max are.
// State: histogram [C, bins] f32, min, max (f32), initialized (u8) per channel;
// nonfinite_count, observer_enabled.
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_defs.h"
#include "ops/observer/torch_histogram.h"

namespace qg {
namespace {

std::vector<TensorType> infer_histogram(const InferContext& ctx) {
  std::vector<TensorType> out = infer_observer_outputs(ctx);
  out.push_back(out[0]);
  out.push_back(out[0]);
  return out;
}

std::vector<StateSpec> histogram_states(const InferContext& ctx) {
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  const int64_t c = l.num_qparams, bins = ctx.attrs.get_int("bins");
  std::vector<StateSpec> s = {{"histogram", {DType::f32, {c, bins}}, 0.0},
                              {"min", {DType::f32, {c}}, 0.0},
                              {"max", {DType::f32, {c}}, 0.0},
                              {"initialized", {DType::u8, {c}}, 0}};
  append_common_states(s);
  return s;
}

void histogram_observer_cpu(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  const ScopeLayout& l = args.layout;
  const int64_t bins = args.bins;
  const int64_t upsample = args.upsample_rate;
  const int64_t dst_nbins = args.dst_nbins;
  CommonStates common = common_states(ctx, 4);
  const size_t n = static_cast<size_t>(l.num_qparams);
  auto channel = [&](size_t q) {
    TorchHistogram h;
    h.hist = ctx.states[0].data<float>() + static_cast<int64_t>(q) * bins;
    h.min = ctx.states[1].data<float>() + q;
    h.max = ctx.states[2].data<float>() + q;
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
    for (size_t q = 0; q < n; ++q) torch_histogram_update(channel(q), values[q], upsample);
  }
  std::vector<float> lo(n, 0.0f), hi(n, 0.0f);
  std::vector<bool> valid(n);
  for (size_t q = 0; q < n; ++q) {
    TorchHistogram h = channel(q);
    valid[q] = *h.initialized != 0;
    if (valid[q]) torch_histogram_search(h, dst_nbins, lo[q], hi[q]);
    ctx.outputs[2].data<float>()[q] = lo[q];
    ctx.outputs[3].data<float>()[q] = hi[q];
  }
  write_qparams(ctx, lo, hi, valid);
}

}  // namespace

void define_histogram_observer(OpRegistry& r) {
  OpDef& op = r.define("histogram_observer");
  op.parse_args = parse_observer_args;
  op.doc =
      "PyTorch HistogramObserver: histogram with range growth by merging and an L2-error "
      "search for the clipping range; per tensor or per channel.";
  op.inputs = {"x"};
  op.outputs = {"scale", "zero_point", "range_min", "range_max"};
  op.attrs =
      observer_attrs({int_attr("bins", 2048, "histogram bins per channel", 1, int64_t{1} << 20),
                      int_attr("upsample_rate", 128, "up-sampling factor when histograms merge", 1,
                               int64_t{1} << 12)});
  op.infer = infer_histogram;
  op.states = histogram_states;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, histogram_observer_cpu});
}

}  // namespace qg
