// The parsed arguments of batch_norm and layer_norm, read by their CPU and CUDA kernels and
// by the fused channel_div + batch_norm kernel through its batch_norm part.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct NormArgs : KernelArgs {
  double eps = 0.0;
  double momentum = 0.0;  // batch_norm's running-statistics update weight
};

inline std::shared_ptr<const KernelArgs> parse_norm_args(const ArgsSource& s) {
  auto args = std::make_shared<NormArgs>();
  args->eps = s.attrs.get_real("eps");
  if (s.attrs.has("momentum")) args->momentum = s.attrs.get_real("momentum");
  return args;
}

}  // namespace qg
