// The `qat crosscheck` spec of the lsq family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("lsq_backward", 0, {1, 2});
}

}  // namespace
}  // namespace qg
