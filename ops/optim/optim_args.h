// The parsed arguments of sgd, adam, adamw and clip_grad_norm, read by their CPU and CUDA
// kernels (sgd's and adam's also by the fused ste + optimizer kernel through its optimizer
// part). Hyper-parameters stay doubles: the kernels round them (and 1 - beta,
// 1 - dampening) to the parameter dtype as before.
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

// adamw's hyper-parameters; its rate is an input (read on the device at every run).
struct AdamWArgs : KernelArgs {
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool decoupled = true;  // false: weight_decay is Adam's L2 term added to the gradient
};

struct ClipGradNormArgs : KernelArgs {
  double max_norm = 0;
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

inline std::shared_ptr<const KernelArgs> parse_adamw_args(const ArgsSource& s) {
  auto args = std::make_shared<AdamWArgs>();
  args->beta1 = s.attrs.get_real("beta1");
  args->beta2 = s.attrs.get_real("beta2");
  args->eps = s.attrs.get_real("eps");
  args->weight_decay = s.attrs.get_real("weight_decay");
  args->decoupled = s.attrs.get_bool("decoupled");
  return args;
}

inline std::shared_ptr<const KernelArgs> parse_clip_grad_norm_args(const ArgsSource& s) {
  auto args = std::make_shared<ClipGradNormArgs>();
  args->max_norm = s.attrs.get_real("max_norm");
  return args;
}

}  // namespace qg
