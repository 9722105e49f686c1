// The parsed arguments of matmul and batched_matmul, shared by their CPU and CUDA kernels.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct MatmulArgs : KernelArgs {
  bool transpose_a = false;
  bool transpose_b = false;
};

inline std::shared_ptr<const KernelArgs> parse_matmul_args(const ArgsSource& s) {
  auto args = std::make_shared<MatmulArgs>();
  args->transpose_a = s.attrs.get_bool("transpose_a");
  args->transpose_b = s.attrs.get_bool("transpose_b");
  return args;
}

}  // namespace qg
