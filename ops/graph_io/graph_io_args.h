// The parsed arguments of the plumbing ops' kernels (graph inputs read none).
#pragma once

#include "core/kernel_args.h"

namespace qg {

struct FullLikeArgs : KernelArgs {
  double value = 0.0;  // rounded to y's dtype when filled
};

}  // namespace qg
