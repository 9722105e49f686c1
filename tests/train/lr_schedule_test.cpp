// The warm-up + cosine learning-rate schedule and its levels.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/core/test_util.h"
#include "train/lr_schedule.h"

namespace qg {
namespace {

using testing::expect_error;

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  nn::LrSchedule s{/*peak=*/1e-3, /*warmup=*/10, /*total=*/110, /*min_ratio=*/0.1, /*levels=*/32};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);  // the cosine starts at the peak
  // Halfway through the decay: floor + (peak - floor) / 2.
  EXPECT_NEAR(s.at(10 + 99 / 2.0), 0.55e-3, 1e-5);
  EXPECT_NEAR(s.at(109), 1e-4, 1e-15);  // the last step reaches the floor
  EXPECT_NEAR(s.at(500), 1e-4, 1e-15);  // and stays there
  for (int64_t t = 10; t < 109; ++t) EXPECT_GE(s.at(t), s.at(t + 1)) << t;
}

TEST(LrSchedule, AppliedRatesAreLevelsAtOrAboveTheSchedule) {
  nn::LrSchedule s{2e-3, 20, 200, 0.0, 8};
  int changes = 0;
  for (int64_t t = 0; t < 200; ++t) {
    const double a = s.applied(t), level = a / (2e-3 / 8);
    EXPECT_NEAR(level, std::round(level), 1e-9) << t;  // a multiple of peak / levels
    EXPECT_GE(a, s.at(t) - 1e-15) << t;
    EXPECT_LT(a - s.at(t), 2e-3 / 8 + 1e-15) << t;  // within one level above
    EXPECT_GE(a, 2e-3 / 8);                         // never zero
    if (t > 0 && a != s.applied(t - 1)) ++changes;
  }
  // Up through 8 levels and down through 7: at most 15 recompiles for the whole run.
  EXPECT_LE(changes, 15);
  EXPECT_GE(changes, 8);
}

TEST(LrSchedule, OutOfRangeFieldsAreNamedErrors) {
  expect_error(
      [] {
        nn::LrSchedule{0.0, 0, 10, 0.1, 8}.validate();
      },
      {"[train.lr_schedule]", "peak rate 0"});
  expect_error(
      [] {
        nn::LrSchedule{1e-3, -1, 10, 0.1, 8}.validate();
      },
      {"[train.lr_schedule]", "warmup -1"});
  expect_error(
      [] {
        nn::LrSchedule{1e-3, 0, 10, 1.5, 8}.validate();
      },
      {"[train.lr_schedule]", "min_ratio 1.5"});
  expect_error(
      [] {
        nn::LrSchedule{1e-3, 0, 10, 0.1, 0}.validate();
      },
      {"[train.lr_schedule]", "levels 0"});
}

}  // namespace
}  // namespace qg
