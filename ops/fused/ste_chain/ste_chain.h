// The fused pair of straight-through estimators (see ste_chain_op.cpp).
#pragma once

#include "core/op_registry.h"

namespace qg {

// Checks what the fused_ste_chain kernels rely on: two contiguous u8 masks of one bit per
// element of dy.
void check_fused_ste_chain_inputs(const KernelContext& ctx);

// Registers fused_ste_chain with its fusion rule (called by define_fused_ops).
void define_fused_ste_chain_op(OpRegistry& r);

}  // namespace qg
