// The parsed arguments of conv_bn_fold_weight, shared by its CPU and CUDA kernels.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct FoldArgs : KernelArgs {
  double eps = 0.0;  // rounded to the tensors' dtype by the kernels
};

inline std::shared_ptr<const KernelArgs> parse_fold_args(const ArgsSource& s) {
  auto args = std::make_shared<FoldArgs>();
  args->eps = s.attrs.get_real("eps");
  return args;
}

}  // namespace qg
