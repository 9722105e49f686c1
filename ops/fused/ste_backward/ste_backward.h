// The fused straight-through-estimator + activation backward op (see
// ste_backward_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Backward ops whose `dy` input may come straight from an ste_backward in the fused node:
// element-wise dx = f(dy, x) with x the activation's input.
const std::vector<std::string>& ste_fusible_consumers();

// Registers fused_ste_backward (called by define_fused_ops).
void define_fused_ste_backward_op(OpRegistry& r);

}  // namespace qg
