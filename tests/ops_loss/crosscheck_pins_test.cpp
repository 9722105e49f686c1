// The `qat crosscheck` spec of the loss family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("softmax_cross_entropy", 5, {-1});
  expect_crosscheck_pins("softmax_cross_entropy_backward", 0, {-1});
}

}  // namespace
}  // namespace qg
