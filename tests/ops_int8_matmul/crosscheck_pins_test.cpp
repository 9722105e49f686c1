// The `qat crosscheck` spec of the int8_matmul family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("int8_matmul", 5, {});
  expect_crosscheck_pins("int8_matmul_ste", 1, {});
}

}  // namespace
}  // namespace qg
