// The steps of PyTorch's HistogramObserver (see torch_histogram.h) as QG_HD functions, so
// the CPU kernel and the CUDA kernels run the same f32/f64 operations in the same order and
// agree bit for bit. Each step is written so that its parallel parts are independent:
// - plan_histogram_update: the range adjustment of one batch (one thread per channel);
// - combined_bin: one bin of the merged histogram, given f64 prefix sums of the old one;
// - l2_error_term + the canonical lane order of kL2Lanes: the quantization error of one
//   candidate range, summed in an order a 256-thread block reproduces exactly;
// - L2Search: the candidate-range walk, advanced by one thread.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/common/quant_math.h"
#include "ops/observer/observer_math.h"

namespace qg::histmath {

// What one batch does to a histogram.
enum class HistMode : int32_t {
  kNone = 0,     // no finite value (or no update): nothing changes
  kReplace = 1,  // first batch or degenerate old range: the histogram is this batch alone
  kAdd = 2,      // the range is unchanged: add this batch's counts
  kCombine = 3,  // the range grew: up-sample the old histogram onto the new range
  kRebin = 4,    // merge grid not representable: move each old bin to its centre's new bin
};

struct HistPlan {
  HistMode mode = HistMode::kNone;
  float histc_lo = 0, histc_hi = 0;  // bounds this batch is binned over
  float new_min = 0, new_max = 0;    // the state's range afterwards
  float old_min = 0, old_max = 0;    // the range before (kRebin reads the old bin centres)
  int64_t down = 1, start = 0;       // kCombine's down-sampling factor and first grid cell
};

// 2^31: the largest down-sampling factor PyTorch's merge grid could represent.
constexpr float kMaxDownsample = 2147483648.0f;

// The range adjustment of one batch with finite range [bmin, bmax] (PyTorch's forward:
// _adjust_min_max in f32 tensor arithmetic).
QG_HD HistPlan plan_histogram_update(float bmin, float bmax, bool initialized, float old_min,
                                     float old_max, int64_t bins, int64_t upsample_rate) {
  HistPlan p;
  p.old_min = old_min;
  p.old_max = old_max;
  if (!initialized || old_min == old_max) {
    p.mode = HistMode::kReplace;
    p.new_min = bmin;
    p.new_max = bmax;
    p.histc_lo = bmin;
    p.histc_hi = bmax;
    if (bmin == bmax) {  // histc widens an empty range by 1 on each side (in f64)
      p.histc_lo = static_cast<float>(static_cast<double>(bmin) - 1.0);
      p.histc_hi = static_cast<float>(static_cast<double>(bmax) + 1.0);
    }
    return p;
  }
  float cmin = obsmath::ordered_min(bmin, old_min), cmax = obsmath::ordered_max(bmax, old_max);
  float cell = (old_max - old_min) / static_cast<float>(bins * upsample_rate);
  float old_span = static_cast<float>(bins) * cell;
  float ratio = (cmax - cmin) / old_span;
  if (!(cell > 0.0f) || !(ratio <= kMaxDownsample) || !qmath::is_finite(ceilf(ratio) * old_span)) {
    // A range of a few subnormals, or a jump by more than 2^31 (PyTorch would divide by zero
    // or allocate the grid): keep the unadjusted combined range.
    p.mode = HistMode::kRebin;
    p.new_min = p.histc_lo = cmin;
    p.new_max = p.histc_hi = cmax;
    return p;
  }
  int64_t down = static_cast<int64_t>(ceilf(ratio));
  float e = static_cast<float>(down) * old_span - (cmax - cmin);
  cmax = cmax + e;
  p.start = static_cast<int64_t>(qmath::round_even((old_min - cmin) / cell));
  p.down = down > 1 ? down : 1;
  p.new_min = p.histc_lo = cmin;
  p.new_max = p.histc_hi = cmax;
  p.mode = (cmin == old_min && cmax == old_max) ? HistMode::kAdd : HistMode::kCombine;
  return p;
}

// _combine_histograms for new bin j: the old histogram, each bin repeated `up` times, sits
// at cell `start` of a grid of bins * down cells; new bin j folds cells [j*down, (j+1)*down).
// The cumulative sums are evaluated in closed form from `prefix` (prefix[i] = f64 sum of
// old[0..i), summed in index order) instead of building the grid PyTorch allocates. PyTorch
// keeps the shifted cumulative sum in f32, hence the rounding of the previous integral.
QG_HD double grid_integral(const double* prefix, const float* old, int64_t bins, int64_t up,
                           int64_t start, int64_t last_cell) {
  const int64_t cells = bins * up;
  int64_t n = qmath::clamp<int64_t>(last_cell - start + 1, 0, cells);
  int64_t full = n / up, part = n % up;
  double s = static_cast<double>(up) * prefix[full];
  if (part > 0) s += static_cast<double>(part) * old[full];
  return s;
}

QG_HD float combined_bin(int64_t j, const double* prefix, const float* old, int64_t bins,
                         int64_t up, int64_t down, int64_t start) {
  double cum = grid_integral(prefix, old, bins, up, start, (j + 1) * down - 1);
  float previous = static_cast<float>(grid_integral(prefix, old, bins, up, start, j * down - 1));
  return static_cast<float>((cum - static_cast<double>(previous)) / static_cast<double>(up));
}

// The new bin of old bin i's centre (kRebin).
QG_HD int64_t rebin_target(int64_t i, float old_min, float old_max, float lo, float hi,
                           int64_t bins) {
  const double w =
      (static_cast<double>(old_max) - static_cast<double>(old_min)) / static_cast<double>(bins);
  float centre = static_cast<float>(static_cast<double>(old_min) + (i + 0.5) * w);
  centre = qmath::clamp(centre, lo, hi);
  return obsmath::histc_bin(centre, lo, hi, bins);
}

// _compute_quantization_error for the candidate bins [ns, ne]: per-bin f32 terms.
struct L2Error {
  float bwf, dbwf, half, neg_half, top, unit;
  int64_t ns;
  bool zero;  // a zero-width destination bin: the error is 0
};

QG_HD L2Error l2_error_setup(float hmin, float hmax, int64_t bins, int64_t dst_nbins, int64_t ns,
                             int64_t ne) {
  L2Error e{};
  double bw = (static_cast<double>(hmax) - static_cast<double>(hmin)) / static_cast<double>(bins);
  double dbw = bw * static_cast<double>(ne - ns + 1) / static_cast<double>(dst_nbins);
  e.zero = dbw == 0.0;
  e.bwf = static_cast<float>(bw);
  e.dbwf = static_cast<float>(dbw);
  e.half = static_cast<float>(dbw / 2);
  e.neg_half = static_cast<float>(-dbw / 2);
  e.top = static_cast<float>(dst_nbins - 1);
  // The middle term's unit norm: a 0-dim f32 computation in PyTorch.
  e.unit = (e.half * e.half * e.half - e.neg_half * e.neg_half * e.neg_half) / 3.0f;
  e.ns = ns;
  return e;
}

QG_HD float l2_error_term(const L2Error& e, int64_t i, float count) {
  float begin = static_cast<float>(i - e.ns) * e.bwf;
  float end = begin + e.bwf;
  float dst_begin = qmath::clamp(obsmath::floor_div(begin, e.dbwf), 0.0f, e.top);
  float dst_end = qmath::clamp(obsmath::floor_div(end, e.dbwf), 0.0f, e.top);
  float begin_center = (dst_begin + 0.5f) * e.dbwf;
  float density = count / e.bwf;
  float d0 = begin - begin_center;
  float norm = 0.0f;
  norm = norm + density * ((e.half * e.half * e.half - d0 * d0 * d0) / 3.0f);
  norm = norm + (dst_end - dst_begin - 1.0f) * (density * e.unit);
  float end_center = dst_end * e.dbwf + e.half;
  float d1 = end - end_center;
  norm = norm + density * ((d1 * d1 * d1 - e.neg_half * e.neg_half * e.neg_half) / 3.0f);
  return norm;
}

// The canonical summation order of the error terms (PyTorch sums f32 terms into an f32
// scalar; we sum in f64 and round once): lane t sums bins t, t + kL2Lanes, ... in order,
// then lanes fold pairwise, lane t += lane t + stride for stride = kL2Lanes / 2 ... 1. A
// block of kL2Lanes threads reproduces it exactly.
constexpr int kL2Lanes = 256;

QG_HD double l2_lane_sum(const L2Error& e, const float* hist, int64_t bins, int lane) {
  double s = 0.0;
  for (int64_t i = lane; i < bins; i += kL2Lanes)
    s += static_cast<double>(l2_error_term(e, i, hist[i]));
  return s;
}

// The search state of _non_linear_param_search. `csum` is the f32 cumulative histogram
// (accumulated in f64 in index order) and `total` its last value.
struct L2Search {
  double alpha, beta, total, norm_min;
  int64_t start, end, cand_start, cand_end;
};

QG_HD L2Search l2_search_begin(double total, int64_t bins) {
  return {0.0, 1.0, total, INFINITY, 0, bins - 1, 0, bins - 1};
}

// Advances to the next candidate range that differs from the current one; false when the
// walk is over.
QG_HD bool l2_search_propose(L2Search& s, const float* csum) {
  const double step = 1e-5;
  while (s.alpha < s.beta) {
    double next_alpha = s.alpha + step, next_beta = s.beta - step;
    // Tensor-vs-Python-float comparisons happen in f32.
    const float lo_mass = static_cast<float>(next_alpha * s.total);
    const float hi_mass = static_cast<float>(next_beta * s.total);
    int64_t l = s.start, r = s.end;
    while (l < s.end && csum[l] < lo_mass) ++l;
    while (r > s.start && csum[r] > hi_mass) --r;
    int64_t next_start = s.start, next_end = s.end;
    if ((l - s.start) > (s.end - r)) {
      next_start = l;
      s.alpha = next_alpha;
    } else {
      next_end = r;
      s.beta = next_beta;
    }
    if (next_start == s.start && next_end == s.end) continue;
    s.cand_start = next_start;
    s.cand_end = next_end;
    return true;
  }
  return false;
}

// Takes the candidate unless its error is larger than the best so far (which ends the walk).
QG_HD bool l2_search_accept(L2Search& s, double norm) {
  if (norm > s.norm_min) return false;
  s.norm_min = norm;
  s.start = s.cand_start;
  s.end = s.cand_end;
  return true;
}

}  // namespace qg::histmath
