// The `qat crosscheck` spec of the fold family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("conv_bn_fold_weight", 4, {});
}

}  // namespace
}  // namespace qg
