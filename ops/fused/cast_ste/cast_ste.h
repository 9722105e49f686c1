// The fused widening-cast + straight-through estimator op (see cast_ste_op.cpp) and its
// fusion rule (cast_ste_fusion.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Checks what the fused_cast_ste kernels rely on (a qg::Error naming the op otherwise): a
// contiguous bf16 or f16 dy, a contiguous u8 bit mask of one bit per element, and an f32 dx of
// dy's element count.
void check_fused_cast_ste_inputs(const KernelContext& ctx);

// Registers fused_cast_ste (called by define_fused_ops).
void define_fused_cast_ste_op(OpRegistry& r);

// Fuses a widening cast (bf16/f16 -> f32) and the ste_backward that reads it into one node.
FusionRule cast_ste_fusion_rule();

// Why the ste_backward `ste` may not read its dy's narrow source; empty when it may.
std::string cast_ste_fusion_blocker(const Graph& graph, NodeId ste);

}  // namespace qg
