// The parsed arguments of dynamic_range_quantize, shared by its CPU and CUDA kernels: the
// range and scope of every quantization op, and the qparams mode.
#pragma once

#include <memory>

#include "ops/common/quant_args.h"

namespace qg {

struct DynamicQuantArgs : QuantScopeArgs {
  bool symmetric = false;  // mode = symmetric: scale = max|x| / qmax, zero point 0
};

inline std::shared_ptr<const KernelArgs> parse_dynamic_quant_args(const ArgsSource& s) {
  std::shared_ptr<const KernelArgs> scope = quant_scope_parser(0)(s);
  auto args = std::make_shared<DynamicQuantArgs>();
  static_cast<QuantScopeArgs&>(*args) = dynamic_cast<const QuantScopeArgs&>(*scope);
  args->symmetric = s.attrs.get_string("mode") == "symmetric";
  return args;
}

}  // namespace qg
