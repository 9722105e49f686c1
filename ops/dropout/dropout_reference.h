// The dropout mask a given (seed, step) draws, computed on the host from the shared
// generator (the oracle of dropout's gradient check and of its tests), and the parsed
// arguments and backward scale shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/op_schema.h"

namespace qg {

// mask[i] = 1 (keep) or 0 (drop) for elements 0 .. n - 1 of training run `step`.
std::vector<uint8_t> dropout_reference_mask(int64_t n, double p, int64_t seed, int64_t step);

// The parsed arguments of dropout and dropout_backward (which has no seed).
struct DropoutArgs : KernelArgs {
  double p = 0.0;
  uint64_t seed = 0;
};
std::shared_ptr<const KernelArgs> parse_dropout_args(const ArgsSource& source);

// dropout_backward's factor: 1 / (1 - p) in training, 1 in eval mode (forward = identity).
double dropout_backward_scale(const KernelContext& ctx);

}  // namespace qg
