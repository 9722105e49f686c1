// The `qat crosscheck` spec of the activation family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("relu", 2, {});
  expect_crosscheck_pins("gelu", 3, {-1});
  expect_crosscheck_pins("gelu_backward", 0, {-1});
  expect_crosscheck_pins("silu", 1, {-1});
  expect_crosscheck_pins("silu_backward", 0, {-1});
}

}  // namespace
}  // namespace qg
