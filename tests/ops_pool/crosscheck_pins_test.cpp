// The `qat crosscheck` spec of the pool family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("max_pool2d", 2, {});
  expect_crosscheck_pins("avg_pool2d", 1, {});
  expect_crosscheck_pins("global_avg_pool2d", 1, {});
}

}  // namespace
}  // namespace qg
