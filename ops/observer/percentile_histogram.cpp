#include "ops/observer/percentile_histogram.h"

#include <algorithm>
#include <cmath>

#include "ops/observer/observer_math.h"

namespace qg {
namespace {

// Doubles the width once, shifting the range left by m new bins.
void grow_once(PercentileHistogram& h, double batch_min) {
  const int64_t bins = h.bins;
  const double w2 = 2.0 * *h.width;
  double need = std::ceil((*h.lo - batch_min) / w2);
  int64_t m = need > 0.0 ? static_cast<int64_t>(std::min(need, static_cast<double>(bins / 2))) : 0;
  std::vector<int64_t> merged(static_cast<size_t>(bins), 0);
  for (int64_t i = 0; i < bins; ++i) merged[static_cast<size_t>(m + i / 2)] += h.counts[i];
  std::copy(merged.begin(), merged.end(), h.counts);
  *h.lo = *h.lo - static_cast<double>(m) * w2;
  *h.width = w2;
}

}  // namespace

void percentile_histogram_update(PercentileHistogram h, const std::vector<float>& values) {
  if (values.empty()) return;
  double vmin = 0.0, vmax = 0.0;
  for (float v : values) {
    vmin = std::min(vmin, static_cast<double>(v));
    vmax = std::max(vmax, static_cast<double>(v));
  }
  const int64_t bins = h.bins;
  if (!*h.initialized) {
    *h.lo = vmin;
    double span = vmax - vmin;
    *h.width = (span > 0.0 ? span : 1.0) / static_cast<double>(bins);
    *h.initialized = 1;
    std::fill(h.counts, h.counts + bins, int64_t{0});
  }
  // Finite f32 inputs keep this loop short: each pass doubles the width.
  while (!(vmin >= *h.lo && vmax <= *h.lo + static_cast<double>(bins) * *h.width))
    grow_once(h, vmin);
  for (float v : values)
    ++h.counts[obsmath::percentile_bin(static_cast<double>(v), *h.lo, *h.width, bins)];
}

int64_t percentile_histogram_total(const PercentileHistogram& h) {
  int64_t total = 0;
  for (int64_t i = 0; i < h.bins; ++i) total += h.counts[i];
  return total;
}

double percentile_histogram_value(const PercentileHistogram& h, double q) {
  int64_t before = 0;
  for (int64_t k = 0; k < h.bins; ++k) {
    const int64_t c = h.counts[k];
    if (c == 0) continue;
    if (static_cast<double>(before + c) >= q) {
      double frac = (q - static_cast<double>(before)) / static_cast<double>(c);
      frac = std::max(frac, 0.0);
      return *h.lo + *h.width * (static_cast<double>(k) + frac);
    }
    before += c;
  }
  return *h.lo + *h.width * static_cast<double>(h.bins);
}

}  // namespace qg
