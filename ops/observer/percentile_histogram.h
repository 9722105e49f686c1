// The percentile observer's histogram: `bins` integer counts over [lo, lo + bins * width]
// (f64 edges lo + k * width; a value's bin is floor((v - lo) / width) clamped into
// [0, bins - 1]). The range always includes 0. Counts stay exact integers when the range
// grows, because growth only ever doubles the width, merging old bins in pairs:
//   repeat until the batch's [min(v, 0), max(v, 0)] fits:
//     W = 2 * width;  m = min(ceil((lo - batch_min) / W), floor(bins / 2)), at least 0;
//     old bin i moves to bin m + floor(i / 2);  lo -= m * W;  width = W.
// The first batch sets lo = min(v, 0) and width = (max(v, 0) - lo) / bins (1 / bins when
// that span is 0).
#pragma once

#include <cstdint>
#include <vector>

namespace qg {

struct PercentileHistogram {
  int64_t* counts = nullptr;  // [bins]
  double* lo = nullptr;
  double* width = nullptr;
  uint8_t* initialized = nullptr;
  int64_t bins = 2048;
};

// Adds a batch of finite values (already |x| for the symmetric scheme).
void percentile_histogram_update(PercentileHistogram h, const std::vector<float>& values);

// The value below which a mass q (0 <= q <= total) of the counts lies: counts are spread
// uniformly inside each bin, so within the first non-empty bin k whose cumulative count
// reaches q the answer is lo + width * (k + (q - before) / counts[k]).
double percentile_histogram_value(const PercentileHistogram& h, double q);

int64_t percentile_histogram_total(const PercentileHistogram& h);

}  // namespace qg
