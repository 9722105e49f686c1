// The `qat crosscheck` spec of the fused ops, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("fused_channel_div_batch_norm", 0, {-1});
  expect_crosscheck_pins("fused_channel_div_batch_norm_backward", 0, {-1});
  expect_crosscheck_pins("fused_scaled_softmax", 0, {-1});
  expect_crosscheck_pins("fused_scaled_softmax_backward", 0, {-1});
}

}  // namespace
}  // namespace qg
