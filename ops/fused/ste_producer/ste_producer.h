// The fused element-wise producer + straight-through estimator op (see
// ste_producer_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Ops whose output may go straight into an ste_backward's dy in the fused node (through
// reshape views): permute and transpose (any permutation) and add (same-shape operands).
const std::vector<std::string>& ste_fusible_producers();

// Checks what the fused_ste_producer kernels rely on (qg::Error naming the op otherwise):
// fused_from = {producer, reshape..., ste_backward} with a fusible producer; inputs {a, mask}
// (permute, transpose) or {a, mask, b} (add); a of the output's float dtype and element count;
// b of a's dtype and shape (no broadcast); a contiguous u8 mask of one bit per output element.
void check_fused_ste_producer_inputs(const KernelContext& ctx);

// Registers fused_ste_producer (called by define_fused_ops).
void define_fused_ste_producer_op(OpRegistry& r);

}  // namespace qg
