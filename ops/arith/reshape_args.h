// The parsed arguments of reshape. Its own kernel takes the shape from its output; fused
// kernels that apply a reshape part as a view read it here.
#pragma once

#include <memory>

#include "core/kernel_args.h"
#include "core/tensor.h"

namespace qg {

struct ReshapeArgs : KernelArgs {
  Shape shape;
};

inline std::shared_ptr<const KernelArgs> parse_reshape_args(const ArgsSource& s) {
  auto args = std::make_shared<ReshapeArgs>();
  args->shape = s.attrs.get_ints("shape");
  return args;
}

}  // namespace qg
