// The parsed arguments of sum and mean, shared by their CPU and CUDA kernels.
#pragma once

#include "core/kernel_args.h"
#include "core/tensor.h"

namespace qg {

struct ReduceArgs : KernelArgs {
  Shape keep;  // x's shape with the reduced axes set to 1
};

}  // namespace qg
