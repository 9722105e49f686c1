#include "ops/observer/torch_histogram.h"

#include <algorithm>

#include "ops/observer/torch_histogram_math.h"

namespace qg {
namespace {

using namespace histmath;

// torch.histc over [lo, hi] (lo < hi), added to `out` as f32 counts. Counting in int64
// first keeps the counts exact whatever the batch size.
void histc_add(const std::vector<float>& values, float lo, float hi, int64_t bins, float* out) {
  std::vector<int64_t> counts(static_cast<size_t>(bins), 0);
  for (float v : values) {
    int64_t b = obsmath::histc_bin(v, lo, hi, bins);
    if (b >= 0) ++counts[static_cast<size_t>(b)];
  }
  for (int64_t i = 0; i < bins; ++i) out[i] += static_cast<float>(counts[static_cast<size_t>(i)]);
}

double quantization_error(const TorchHistogram& h, int64_t dst_nbins, int64_t ns, int64_t ne) {
  L2Error e = l2_error_setup(*h.min, *h.max, h.bins, dst_nbins, ns, ne);
  if (e.zero) return 0.0;
  double lanes[kL2Lanes];
  for (int t = 0; t < kL2Lanes; ++t) lanes[t] = l2_lane_sum(e, h.hist, h.bins, t);
  for (int stride = kL2Lanes / 2; stride > 0; stride /= 2)
    for (int t = 0; t < stride; ++t) lanes[t] = lanes[t] + lanes[t + stride];
  return static_cast<double>(static_cast<float>(lanes[0]));
}

}  // namespace

void torch_histogram_update(TorchHistogram h, const std::vector<float>& values,
                            int64_t upsample_rate) {
  if (values.empty()) return;
  float bmin = values[0], bmax = values[0];
  for (float v : values) {
    bmin = obsmath::ordered_min(bmin, v);
    bmax = obsmath::ordered_max(bmax, v);
  }
  const int64_t bins = h.bins;
  HistPlan p =
      plan_histogram_update(bmin, bmax, *h.initialized != 0, *h.min, *h.max, bins, upsample_rate);
  std::vector<float> fresh(static_cast<size_t>(bins), 0.0f);
  histc_add(values, p.histc_lo, p.histc_hi, bins, fresh.data());
  switch (p.mode) {
    case HistMode::kNone:
    case HistMode::kReplace:
      break;
    case HistMode::kAdd:
      for (int64_t i = 0; i < bins; ++i) fresh[static_cast<size_t>(i)] += h.hist[i];
      break;
    case HistMode::kCombine: {
      std::vector<double> prefix(static_cast<size_t>(bins) + 1, 0.0);
      for (int64_t i = 0; i < bins; ++i)
        prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + h.hist[i];
      for (int64_t j = 0; j < bins; ++j)
        fresh[static_cast<size_t>(j)] +=
            combined_bin(j, prefix.data(), h.hist, bins, upsample_rate, p.down, p.start);
      break;
    }
    case HistMode::kRebin:
      for (int64_t i = 0; i < bins; ++i)
        if (h.hist[i] != 0.0f)
          fresh[static_cast<size_t>(
              rebin_target(i, p.old_min, p.old_max, p.histc_lo, p.histc_hi, bins))] += h.hist[i];
      break;
  }
  std::copy(fresh.begin(), fresh.end(), h.hist);
  *h.min = p.new_min;
  *h.max = p.new_max;
  *h.initialized = 1;
}

void torch_histogram_search(const TorchHistogram& h, int64_t dst_nbins, float& lo, float& hi) {
  const int64_t bins = h.bins;
  const float bin_width = (*h.max - *h.min) / static_cast<float>(bins);
  std::vector<float> csum(static_cast<size_t>(bins));
  double acc = 0.0;  // torch.cumsum accumulates f32 in f64 on the CPU
  for (int64_t i = 0; i < bins; ++i) {
    acc += h.hist[i];
    csum[static_cast<size_t>(i)] = static_cast<float>(acc);
  }
  L2Search s = l2_search_begin(static_cast<double>(static_cast<float>(acc)), bins);
  while (l2_search_propose(s, csum.data()))
    if (!l2_search_accept(s, quantization_error(h, dst_nbins, s.cand_start, s.cand_end))) break;
  lo = *h.min + bin_width * static_cast<float>(s.start);
  hi = *h.min + bin_width * static_cast<float>(s.end + 1);
}

}  // namespace qg
