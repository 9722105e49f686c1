// The `qat crosscheck` spec of the arith family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("add", 1, {});
  expect_crosscheck_pins("mul", 1, {});
  expect_crosscheck_pins("sub", 1, {});
  expect_crosscheck_pins("sum_to", 0, {-1});
}

}  // namespace
}  // namespace qg
