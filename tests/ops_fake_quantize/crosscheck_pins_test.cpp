// The `qat crosscheck` spec of the fake_quantize family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("fake_quantize", 10, {});
  expect_crosscheck_pins("ste_backward_exact", 2, {});
}

}  // namespace
}  // namespace qg
