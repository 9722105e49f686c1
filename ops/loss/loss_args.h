// The parsed arguments of softmax_cross_entropy and its backward op, shared by their CPU and
// CUDA kernels.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct CrossEntropyArgs : KernelArgs {
  bool mean = true;  // reduction "mean": rows are averaged, else summed
};

inline std::shared_ptr<const KernelArgs> parse_cross_entropy_args(const ArgsSource& s) {
  auto args = std::make_shared<CrossEntropyArgs>();
  args->mean = s.attrs.get_string("reduction") == "mean";
  return args;
}

}  // namespace qg
