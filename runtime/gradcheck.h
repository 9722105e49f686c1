// Gradient checks in f64. Smooth ops are checked against central differences; non-smooth
// quantization ops (whose true derivative is zero almost everywhere) have their
// straight-through rule checked against a reference written from SEMANTICS.md. The checks
// run the graphs they build through an Executor, so they live in runtime, beside the
// CPU-vs-GPU crosscheck, rather than in autograd below it.
#pragma once

#include <string>
#include <vector>

#include "core/op_schema.h"

namespace qg {

struct GradcheckResult {
  std::string op;
  std::string sample;
  std::string dtype;
  std::string method;  // "central-diff" or "reference-rule"
  double max_rel_error = 0;
  double tolerance = 0;
  bool passed = false;
  std::string error;  // set when the check threw
};

// Relative error: max_i |got_i - want_i| / max(max_i |want_i|, 1e-3).
double max_relative_error(const std::vector<double>& got, const std::vector<double>& want);

GradcheckResult gradcheck(const OpDef& op, const GradcheckSample& sample, uint64_t seed = 1234);
// Every sample of every registered differentiable op.
std::vector<GradcheckResult> gradcheck_all(uint64_t seed = 1234);

}  // namespace qg
