// The crosscheck spec every op definition carries (OpDef::crosscheck), checked for all ops at
// once: case labels are unique and fit the op's inputs, and every output compared to rounding
// has a reason beside the op's definition. The counts and the rounded outputs themselves are
// pinned in each family's tests (tests/common/crosscheck_pins.h), and
// tests/core/check_crosscheck_pins.py checks that every op is pinned there.
#include <gtest/gtest.h>

#include <set>

#include "core/op_registry.h"
#include "runtime/crosscheck.h"

namespace qg {
namespace {

TEST(CrosscheckSpec, CasesHaveUniqueLabelsAndFitTheirOp) {
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (!op->crosscheck.cases) continue;
    const std::vector<CrosscheckCase> cases = op->crosscheck.cases();
    EXPECT_GT(cases.size(), 0u) << op->name;
    std::set<std::string> labels;
    for (const CrosscheckCase& c : cases) {
      EXPECT_TRUE(labels.insert(c.label).second) << op->name << ": two cases '" << c.label << "'";
      EXPECT_LE(c.inputs.size(), op->inputs.size()) << op->name << ": " << c.label;
    }
  }
}

TEST(CrosscheckSpec, RoundedOutputsExistAndSayWhy) {
  for (const OpDef* op : OpRegistry::instance().all()) {
    const CrosscheckSpec& spec = op->crosscheck;
    EXPECT_EQ(spec.rounded_reason.empty(), spec.rounded_outputs.empty()) << op->name;
    for (int output : spec.rounded_outputs) {
      EXPECT_GE(output, -1) << op->name;
      EXPECT_LT(output, static_cast<int>(op->outputs.size())) << op->name;
    }
  }
}

// The tolerance is the dtype's: no op can loosen its own comparison.
TEST(CrosscheckSpec, RoundedOutputsUseTheirDtypesTolerance) {
  const OpDef* op = OpRegistry::instance().find("matmul");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(compare_rule("matmul", 0, DType::f32).tolerance, 1e-5);
  EXPECT_EQ(compare_rule("matmul", 0, DType::bf16).tolerance, 2.0 * 0.00390625);
  EXPECT_TRUE(compare_rule("fake_quantize", 0, DType::f32).exact);
  EXPECT_TRUE(compare_rule("no_such_op", 0, DType::f32).exact);
}

}  // namespace
}  // namespace qg
