// The `qat crosscheck` spec of the nf4 family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("nf4_quantize_pack", 4, {});
  expect_crosscheck_pins("nf4_unpack_dequantize", 2, {});
  expect_crosscheck_pins("nf4_double_quantize", 1, {});
  expect_crosscheck_pins("nf4_double_dequantize", 1, {});
}

}  // namespace
}  // namespace qg
