// The dropout mask a given (seed, step) draws, computed on the host from the shared
// generator: the oracle of dropout's gradient check and of its tests.
#pragma once

#include <cstdint>
#include <vector>

namespace qg {

// mask[i] = 1 (keep) or 0 (drop) for elements 0 .. n - 1 of training run `step`.
std::vector<uint8_t> dropout_reference_mask(int64_t n, double p, int64_t seed, int64_t step);

}  // namespace qg
