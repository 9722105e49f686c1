// The parsed arguments of gelu and gelu_backward, read by their CPU and CUDA kernels and by
// the fused kernels that run a gelu part.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct GeluArgs : KernelArgs {
  bool tanh = false;  // approximate = "tanh"; else the erf form
};

inline std::shared_ptr<const KernelArgs> parse_gelu_args(const ArgsSource& s) {
  auto args = std::make_shared<GeluArgs>();
  args->tanh = s.attrs.get_string("approximate") == "tanh";
  return args;
}

}  // namespace qg
