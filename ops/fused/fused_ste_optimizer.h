// The fused straight-through estimator + optimizer step and the fused pair of straight-through
// estimators (see fused_ste_optimizer_op.cpp and fused_ste_chain_op.cpp).
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

// Checks what the fused_ste_chain kernels rely on: two contiguous u8 masks of one bit per
// element of dy.
void check_fused_ste_chain_inputs(const KernelContext& ctx);

// Registers fused_ste_optimizer and fused_ste_chain (called by define_fused_ops).
void define_fused_ste_optimizer_op(OpRegistry& r);
void define_fused_ste_chain_op(OpRegistry& r);

}  // namespace qg
