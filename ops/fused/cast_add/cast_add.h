// The fused widening-cast + add op (see cast_add_op.cpp) and its fusion rule
// (cast_add_fusion.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Checks what the fused_cast_add kernels rely on (a qg::Error naming the op otherwise): two
// contiguous inputs of f32, bf16 or f16, each with the output's element count, and an f32
// output.
void check_fused_cast_add_inputs(const KernelContext& ctx);

// Registers fused_cast_add (called by define_fused_ops).
void define_fused_cast_add_op(OpRegistry& r);

// Fuses an f32 add with the widening casts (bf16/f16 -> f32) that feed it, through reshape
// views, into one fused_cast_add node.
FusionRule cast_add_fusion_rule();

// Why the add `add` may not be fused with the casts feeding it; empty when it may.
std::string cast_add_fusion_blocker(const Graph& graph, NodeId add);

}  // namespace qg
