// The cases `qat crosscheck` runs: every gradient-check sample of every differentiable op
// (forward and backward graph), plus a table of extra cases for the non-differentiable ops
// (observers, quantize-to-storage, ...) and for edges the samples do not reach (every scope,
// halfway ties, NaN/Inf, sizes that need several blocks and vector tails, bad qparams).
#pragma once

#include <string>
#include <vector>

#include "core/op_schema.h"

namespace qg::cli {

struct CrosscheckCase {
  std::string op;
  std::string label;
  // An f64 input takes the case's dtype (f32, f64, f16 or bf16); other dtypes are kept.
  std::vector<GradcheckInput> inputs;
  Attrs attrs;
  bool backward = false;  // also build the gradient graph of output `output`
  int output = 0;
  int steps = 2;
  bool float_only = false;  // f32 only (cases that pin exact f32 values)
};

// The extra case table (crosscheck_cases.cpp).
std::vector<CrosscheckCase> extra_crosscheck_cases();

}  // namespace qg::cli
