#include "ops/observer/torch_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/observer/observer_math.h"

namespace qg {
namespace {

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

// _combine_histograms: the old histogram, each bin repeated `up` times, placed at cell
// `start` of a grid of bins * down cells; every `down` cells fold into one new bin. The
// cumulative sums are evaluated in closed form (prefix sums in f64) instead of building the
// bins * down grid, which PyTorch allocates and which can be huge after a range jump.
void combine(float* fresh, const std::vector<float>& old, int64_t bins, int64_t up, int64_t down,
             int64_t start) {
  std::vector<double> prefix(static_cast<size_t>(bins) + 1, 0.0);
  for (int64_t i = 0; i < bins; ++i)
    prefix[static_cast<size_t>(i) + 1] =
        prefix[static_cast<size_t>(i)] + old[static_cast<size_t>(i)];
  const int64_t cells = bins * up;
  auto integral = [&](int64_t last_cell) {  // sum of the grid cells [0, last_cell]
    int64_t n = std::clamp<int64_t>(last_cell - start + 1, 0, cells);
    int64_t full = n / up, part = n % up;
    double s = static_cast<double>(up) * prefix[static_cast<size_t>(full)];
    if (part > 0) s += static_cast<double>(part) * old[static_cast<size_t>(full)];
    return s;
  };
  float previous = 0.0f;  // PyTorch keeps the shifted integral in an f32 buffer
  for (int64_t j = 0; j < bins; ++j) {
    double cum = integral((j + 1) * down - 1);
    double interpolated = (cum - static_cast<double>(previous)) / static_cast<double>(up);
    fresh[j] = fresh[j] + static_cast<float>(interpolated);
    previous = static_cast<float>(cum);
  }
}

constexpr float kMaxDownsample = 2147483648.0f;  // 2^31

void rebin_centres(const TorchHistogram& h, float old_min, float old_max, float lo, float hi,
                   float* out) {
  const double w =
      (static_cast<double>(old_max) - static_cast<double>(old_min)) / static_cast<double>(h.bins);
  for (int64_t i = 0; i < h.bins; ++i) {
    if (h.hist[i] == 0.0f) continue;
    float centre = static_cast<float>(static_cast<double>(old_min) + (i + 0.5) * w);
    centre = qmath::clamp(centre, lo, hi);
    out[obsmath::histc_bin(centre, lo, hi, h.bins)] += h.hist[i];
  }
}

// _compute_quantization_error for the candidate bins [ns, ne].
double quantization_error(const TorchHistogram& h, int64_t dst_nbins, int64_t ns, int64_t ne) {
  const int64_t bins = h.bins;
  double bw =
      (static_cast<double>(*h.max) - static_cast<double>(*h.min)) / static_cast<double>(bins);
  double dbw = bw * static_cast<double>(ne - ns + 1) / static_cast<double>(dst_nbins);
  if (dbw == 0.0) return 0.0;
  const float bwf = static_cast<float>(bw), dbwf = static_cast<float>(dbw);
  const float half = static_cast<float>(dbw / 2), neg_half = static_cast<float>(-dbw / 2);
  const float top = static_cast<float>(dst_nbins - 1);
  // The middle term's unit norm: a 0-dim f32 computation in PyTorch.
  const float unit = (half * half * half - neg_half * neg_half * neg_half) / 3.0f;
  double total = 0.0;
  for (int64_t i = 0; i < bins; ++i) {
    float begin = static_cast<float>(i - ns) * bwf;
    float end = begin + bwf;
    float dst_begin = qmath::clamp(obsmath::floor_div(begin, dbwf), 0.0f, top);
    float dst_end = qmath::clamp(obsmath::floor_div(end, dbwf), 0.0f, top);
    float begin_center = (dst_begin + 0.5f) * dbwf;
    float density = h.hist[i] / bwf;
    float d0 = begin - begin_center;
    float norm = 0.0f;
    norm = norm + density * ((half * half * half - d0 * d0 * d0) / 3.0f);
    norm = norm + (dst_end - dst_begin - 1.0f) * (density * unit);
    float end_center = dst_end * dbwf + half;
    float d1 = end - end_center;
    norm = norm + density * ((d1 * d1 * d1 - neg_half * neg_half * neg_half) / 3.0f);
    total += norm;
  }
  // PyTorch sums the f32 terms into an f32 scalar; we sum in f64 (order-independent to
  // within rounding) and round once.
  return static_cast<double>(static_cast<float>(total));
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
  if (!*h.initialized || *h.min == *h.max) {
    // First batch (or a degenerate range): restart from this batch alone, as PyTorch does.
    *h.min = bmin;
    *h.max = bmax;
    *h.initialized = 1;
    float lo = bmin, hi = bmax;
    if (lo == hi) {  // histc widens an empty range by 1 on each side (in f64)
      lo = static_cast<float>(static_cast<double>(lo) - 1.0);
      hi = static_cast<float>(static_cast<double>(hi) + 1.0);
    }
    std::fill(h.hist, h.hist + bins, 0.0f);
    histc_add(values, lo, hi, bins, h.hist);
    return;
  }
  const float old_min = *h.min, old_max = *h.max;
  float cmin = obsmath::ordered_min(bmin, old_min), cmax = obsmath::ordered_max(bmax, old_max);
  // _adjust_min_max, in f32 tensor arithmetic.
  float cell = (old_max - old_min) / static_cast<float>(bins * upsample_rate);
  float old_span = static_cast<float>(bins) * cell;
  float ratio = (cmax - cmin) / old_span;
  std::vector<float> fresh(static_cast<size_t>(bins), 0.0f);
  if (!(cell > 0.0f) || !(ratio <= kMaxDownsample) ||
      !std::isfinite(static_cast<float>(std::ceil(ratio)) * old_span)) {
    // The merge grid is not representable (a range of a few subnormals, or a jump by more
    // than 2^31; PyTorch would divide by zero or allocate the grid): keep the unadjusted
    // combined range and move each old bin's mass to the new bin of its centre.
    histc_add(values, cmin, cmax, bins, fresh.data());
    rebin_centres(h, old_min, old_max, cmin, cmax, fresh.data());
    std::copy(fresh.begin(), fresh.end(), h.hist);
    *h.min = cmin;
    *h.max = cmax;
    return;
  }
  int64_t down = static_cast<int64_t>(std::ceil(ratio));
  float e = static_cast<float>(down) * old_span - (cmax - cmin);
  cmax = cmax + e;
  int64_t start = static_cast<int64_t>(std::nearbyint((old_min - cmin) / cell));
  histc_add(values, cmin, cmax, bins, fresh.data());
  if (cmin == old_min && cmax == old_max) {
    for (int64_t i = 0; i < bins; ++i) fresh[static_cast<size_t>(i)] += h.hist[i];
  } else {
    std::vector<float> old(h.hist, h.hist + bins);
    combine(fresh.data(), old, bins, upsample_rate, std::max<int64_t>(down, 1), start);
  }
  std::copy(fresh.begin(), fresh.end(), h.hist);
  *h.min = cmin;
  *h.max = cmax;
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
  const double total = static_cast<double>(static_cast<float>(acc));
  const double step = 1e-5;
  double alpha = 0.0, beta = 1.0;
  int64_t start = 0, end = bins - 1;
  double norm_min = std::numeric_limits<double>::infinity();
  while (alpha < beta) {
    double next_alpha = alpha + step, next_beta = beta - step;
    // Tensor-vs-Python-float comparisons happen in f32.
    const float lo_mass = static_cast<float>(next_alpha * total);
    const float hi_mass = static_cast<float>(next_beta * total);
    int64_t l = start, r = end;
    while (l < end && csum[static_cast<size_t>(l)] < lo_mass) ++l;
    while (r > start && csum[static_cast<size_t>(r)] > hi_mass) --r;
    int64_t next_start = start, next_end = end;
    if ((l - start) > (end - r)) {
      next_start = l;
      alpha = next_alpha;
    } else {
      next_end = r;
      beta = next_beta;
    }
    if (next_start == start && next_end == end) continue;
    double norm = quantization_error(h, dst_nbins, next_start, next_end);
    if (norm > norm_min) break;
    norm_min = norm;
    start = next_start;
    end = next_end;
  }
  lo = *h.min + bin_width * static_cast<float>(start);
  hi = *h.min + bin_width * static_cast<float>(end + 1);
}

}  // namespace qg
