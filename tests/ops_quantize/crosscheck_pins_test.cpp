// The `qat crosscheck` spec of the quantize family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("quantize", 4, {});
  expect_crosscheck_pins("dequantize_backward", 0, {1});
}

}  // namespace
}  // namespace qg
