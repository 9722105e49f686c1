// The fused straight-through estimator + optimizer step (see ste_optimizer_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Optimizer steps whose `grad` input may come straight from an ste_backward in the fused
// node: element-wise in-place updates of the parameter (ops/optim).
const std::vector<std::string>& ste_fusible_optimizers();

// Checks what the fused_ste_optimizer kernels rely on (qg::Error naming the op otherwise): a
// step of a fusible kind, dy of the parameter's dtype and shape, a mask of one bit per element.
void check_fused_ste_optimizer_inputs(const KernelContext& ctx);

// Registers fused_ste_optimizer with its fusion rule (called by define_fused_ops).
void define_fused_ste_optimizer_op(OpRegistry& r);

}  // namespace qg
