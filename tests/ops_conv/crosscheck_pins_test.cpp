// The `qat crosscheck` spec of the conv family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("conv2d", 0, {-1});
  expect_crosscheck_pins("conv2d_backward_input", 0, {-1});
  expect_crosscheck_pins("conv2d_backward_weight", 0, {-1});
  expect_crosscheck_pins("conv2d_backward_bias", 0, {-1});
}

}  // namespace
}  // namespace qg
