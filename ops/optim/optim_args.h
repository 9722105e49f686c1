// The parsed arguments of sgd and adam, read by their CPU and CUDA kernels and by the fused
// ste + optimizer kernel through its optimizer part. Hyper-parameters stay doubles: the
// kernels round them (and 1 - beta, 1 - dampening) to the parameter dtype as before.
#pragma once

#include <memory>

#include "core/kernel_args.h"

namespace qg {

struct SgdArgs : KernelArgs {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

struct AdamArgs : KernelArgs {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
};

inline std::shared_ptr<const KernelArgs> parse_sgd_args(const ArgsSource& s) {
  auto args = std::make_shared<SgdArgs>();
  args->lr = s.attrs.get_real("lr");
  args->momentum = s.attrs.get_real("momentum");
  args->dampening = s.attrs.get_real("dampening");
  args->weight_decay = s.attrs.get_real("weight_decay");
  args->nesterov = s.attrs.get_bool("nesterov");
  return args;
}

inline std::shared_ptr<const KernelArgs> parse_adam_args(const ArgsSource& s) {
  auto args = std::make_shared<AdamArgs>();
  args->lr = s.attrs.get_real("lr");
  args->beta1 = s.attrs.get_real("beta1");
  args->beta2 = s.attrs.get_real("beta2");
  args->eps = s.attrs.get_real("eps");
  args->weight_decay = s.attrs.get_real("weight_decay");
  return args;
}

}  // namespace qg
