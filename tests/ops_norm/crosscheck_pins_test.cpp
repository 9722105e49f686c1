// The `qat crosscheck` spec of the norm family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("batch_norm", 0, {-1});
  expect_crosscheck_pins("batch_norm_backward", 0, {-1});
  expect_crosscheck_pins("layer_norm", 0, {-1});
  expect_crosscheck_pins("layer_norm_backward", 0, {-1});
  expect_crosscheck_pins("channel_div_backward", 0, {1});
}

}  // namespace
}  // namespace qg
