// A gradient-check input drawn as the gradient checker draws it: its fixed values when given,
// else uniform in [low, high) from `rng`. For tests that run an op's samples another way.
#pragma once

#include <random>
#include <vector>

#include "core/op_schema.h"

namespace qg::testing {

inline Tensor draw_input(const GradcheckInput& spec, std::mt19937_64& rng) {
  if (!spec.values.empty()) return Tensor::from_doubles(spec.shape, spec.values, spec.dtype);
  std::uniform_real_distribution<double> dist(spec.low, spec.high);
  std::vector<double> v(static_cast<size_t>(shape_numel(spec.shape)));
  for (double& x : v) x = dist(rng);
  return Tensor::from_doubles(spec.shape, v, spec.dtype);
}

}  // namespace qg::testing
