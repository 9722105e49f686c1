// Input specs shared by the op families' `qat crosscheck` cases (OpDef::crosscheck).
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg::crosscheck_spec {

inline const double kNaN = std::numeric_limits<double>::quiet_NaN();
inline const double kInf = std::numeric_limits<double>::infinity();

// An f64 input (takes the case dtype) drawn from [lo, hi].
inline GradcheckInput x_in(Shape s, double lo = -3, double hi = 3) {
  return GradcheckInput(std::move(s), DType::f64, lo, hi);
}

// A fixed-dtype input with explicit values, or drawn from [lo, hi] (integers truncate).
inline GradcheckInput fixed(Shape s, DType d, double lo, double hi, std::vector<double> v = {}) {
  return GradcheckInput(std::move(s), d, lo, hi, std::move(v));
}

// Halfway points of a scale-0.25 grid around zp, NaN, +/-Inf, a huge value and signed
// zeros: the rounding and clamping edges where a backend would first disagree.
inline std::vector<double> edge_values() {
  std::vector<double> v;
  for (int k = -40; k <= 40; k += 3) v.push_back(0.125 * k);
  for (double e : {kNaN, kInf, -kInf, 1e30, -1e30, 0.0, -0.0, 31.875, -32.125, 63.9, 1e-9})
    v.push_back(e);
  while (v.size() % 8 != 5) v.push_back(0.375);  // a partial last mask byte
  return v;
}

// edge_values() as one f64 input.
inline GradcheckInput edges_in() {
  std::vector<double> e = edge_values();
  return GradcheckInput(Shape{static_cast<int64_t>(e.size())}, DType::f64, 0, 0, e);
}

// A sine wave of n values with NaN every 13th and +/-Inf every 17th from the 6th.
inline std::vector<double> with_non_finite(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.7 * static_cast<double>(i)) * 4;
  for (int64_t i = 0; i < n; i += 13) v[i] = kNaN;
  for (int64_t i = 5; i < n; i += 17) v[i] = i % 2 ? kInf : -kInf;
  return v;
}

// Gives `op` its crosscheck cases (called from each family's define function).
inline void set_cases(OpRegistry& r, const std::string& op,
                      std::function<std::vector<CrosscheckCase>()> cases) {
  r.get_mutable(op).crosscheck.cases = std::move(cases);
}

// Marks outputs of `op` as compared to rounding (OpDef::crosscheck.rounded_outputs): their
// indices, or {-1} for every output, and why they cannot be bit-identical (required).
inline void set_rounded_outputs(OpRegistry& r, const std::string& op, std::vector<int> outputs,
                                std::string reason) {
  QG_CHECK(!outputs.empty() && !reason.empty(), op,
           "rounded crosscheck outputs need their indices and a reason");
  CrosscheckSpec& spec = r.get_mutable(op).crosscheck;
  spec.rounded_outputs = std::move(outputs);
  spec.rounded_reason = std::move(reason);
}

}  // namespace qg::crosscheck_spec
