// The `qat crosscheck` spec of the observer family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("minmax_observer", 12, {});
  expect_crosscheck_pins("moving_average_observer", 12, {});
  expect_crosscheck_pins("percentile_observer", 9, {});
  expect_crosscheck_pins("histogram_observer", 7, {});
}

}  // namespace
}  // namespace qg
