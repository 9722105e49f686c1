// The `qat crosscheck` spec of the linalg family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("matmul", 2, {-1});
  expect_crosscheck_pins("batched_matmul", 0, {-1});
}

}  // namespace
}  // namespace qg
