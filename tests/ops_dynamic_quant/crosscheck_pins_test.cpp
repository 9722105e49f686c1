// The `qat crosscheck` spec of the dynamic_quant family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("dynamic_range_quantize", 6, {});
}

}  // namespace
}  // namespace qg
