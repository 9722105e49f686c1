// CPU kernels of the learnable fake-quantize family, and the grad_factor resolution they
// share with the op declaration.
#pragma once

#include "core/op_schema.h"

namespace qg {

// The grad_factor attribute if given, else SEMANTICS.md's default 1 / sqrt(numel * qmax).
double lsq_grad_factor(const std::string& op, const Attrs& attrs, int64_t numel);

void lsq_fake_quantize_cpu(KernelContext& ctx);
void lsq_backward_cpu(KernelContext& ctx);

}  // namespace qg
