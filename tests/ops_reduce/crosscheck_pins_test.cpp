// The `qat crosscheck` spec of the reduce family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("sum", 2, {-1});
  expect_crosscheck_pins("mean", 2, {-1});
}

}  // namespace
}  // namespace qg
