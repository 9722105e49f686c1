#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qg::nn {

void LrSchedule::validate() const {
  QG_CHECK(std::isfinite(peak) && peak > 0, "train.lr_schedule", "peak rate ", peak,
           " must be finite and > 0");
  QG_CHECK(warmup >= 0 && total >= 1, "train.lr_schedule", "warmup ", warmup, " and total ", total,
           " steps: need warmup >= 0, total >= 1");
  QG_CHECK(min_ratio >= 0 && min_ratio <= 1, "train.lr_schedule", "min_ratio ", min_ratio,
           " must be in [0, 1]");
  QG_CHECK(levels >= 1, "train.lr_schedule", "levels ", levels, " must be >= 1");
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total - 1 - warmup));
  const double p = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  const double floor = peak * min_ratio;
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * p));
}

double LrSchedule::applied(int64_t step) const {
  // A small tolerance keeps exact multiples (the peak itself) from rounding up a level.
  const double level = std::ceil(at(step) / peak * levels - 1e-9);
  return peak * std::max(1.0, level) / levels;
}

}  // namespace qg::nn
