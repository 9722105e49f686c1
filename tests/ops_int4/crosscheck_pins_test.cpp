// The `qat crosscheck` spec of the int4 family, pinned (tests/common/crosscheck_pins.h).
#include "tests/common/crosscheck_pins.h"

namespace qg {
namespace {

using testing::expect_crosscheck_pins;

TEST(CrosscheckPins, KeepTheirCasesAndExactOutputs) {
  expect_crosscheck_pins("int4_quantize_pack", 4, {});
  expect_crosscheck_pins("int4_unpack_dequantize", 2, {});
}

}  // namespace
}  // namespace qg
