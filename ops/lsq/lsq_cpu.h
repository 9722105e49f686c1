// CPU kernels of the learnable fake-quantize family, and the grad_factor resolution they
// share with the op declaration.
#pragma once

#include <memory>

#include "core/op_schema.h"
#include "ops/common/quant_args.h"

namespace qg {

// The grad_factor attribute if given, else SEMANTICS.md's default 1 / sqrt(numel * qmax).
double lsq_grad_factor(const std::string& op, const Attrs& attrs, int64_t numel);

// lsq_backward's parsed arguments: its range and scope over x (input 1), and the resolved
// grad_factor for x's element count.
struct LsqBackwardArgs : QuantScopeArgs {
  double grad_factor = 1.0;
};
std::shared_ptr<const KernelArgs> parse_lsq_backward_args(const ArgsSource& source);

void lsq_fake_quantize_cpu(KernelContext& ctx);
void lsq_backward_cpu(KernelContext& ctx);

}  // namespace qg
