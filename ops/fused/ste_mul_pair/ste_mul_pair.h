// The fused straight-through estimator + two multiplies op (see ste_mul_pair_op.cpp).
#pragma once

#include "core/op_registry.h"

namespace qg {

// Throws qg::Error naming the fused node when its inputs, outputs or parts do not fit.
void check_fused_ste_mul_pair(const KernelContext& ctx);

// Registers fused_ste_mul_pair (called by define_fused_ops).
void define_fused_ste_mul_pair_op(OpRegistry& r);

}  // namespace qg
