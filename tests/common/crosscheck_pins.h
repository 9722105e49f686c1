// Pins an op's `qat crosscheck` spec in its family's tests: how many cases it carries and which
// outputs are compared to rounding rather than bit for bit. A case that goes missing, or an
// output whose comparison is loosened, fails the family's own test. Every op that `qat
// crosscheck --list-spec` lists must be pinned by exactly one call in tests/
// (tests/core/check_crosscheck_pins.py).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/op_registry.h"
#include "runtime/crosscheck.h"

namespace qg::testing {

// `cases`: the number of OpDef::crosscheck cases (0 when it has none); `rounded`: the output
// indices compared to rounding, {-1} for all of them, {} when every output is bit for bit.
inline void expect_crosscheck_pins(const std::string& op, size_t cases, std::vector<int> rounded) {
  SCOPED_TRACE("op " + op);
  const OpDef* def = OpRegistry::instance().find(op);
  ASSERT_NE(def, nullptr);
  const CrosscheckSpec& spec = def->crosscheck;
  EXPECT_EQ(spec.cases ? spec.cases().size() : size_t{0}, cases);
  EXPECT_EQ(spec.rounded_outputs, rounded);
  EXPECT_EQ(spec.rounded_reason.empty(), rounded.empty()) << "reason: " << spec.rounded_reason;
  // The tolerance of a rounded output is its dtype's, never the op's own.
  const std::map<DType, double> tolerance = {{DType::f32, 1e-5},
                                             {DType::f64, 1e-5},
                                             {DType::f16, 2.0 * 0.00048828125},
                                             {DType::bf16, 2.0 * 0.00390625}};
  const std::set<int> listed(rounded.begin(), rounded.end());
  for (int output = 0; output < static_cast<int>(def->outputs.size()); ++output) {
    const bool is_rounded = listed.count(-1) || listed.count(output);
    for (const auto& [dtype, tol] : tolerance) {
      const CompareRule rule = compare_rule(op, output, dtype);
      EXPECT_EQ(rule.exact, !is_rounded) << "output " << output;
      if (is_rounded) {
        EXPECT_EQ(rule.tolerance, tol) << dtype_name(dtype);
      }
    }
  }
}

}  // namespace qg::testing
