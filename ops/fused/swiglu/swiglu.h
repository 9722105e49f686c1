// The fused SwiGLU ops (swiglu_op.cpp) and the fusion rule that makes them
// (swiglu_fusion.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Checks what the fused SwiGLU kernels rely on (a qg::Error naming the op otherwise): every
// input and output a contiguous tensor of one float dtype and one element count.
void check_fused_swiglu_tensors(const KernelContext& ctx);

// Registers fused_swiglu and fused_swiglu_backward (called by define_fused_ops).
void define_fused_swiglu_ops(OpRegistry& r);

// Fuses silu(gate) * up and its backward (two muls and a silu_backward) into fused_swiglu and
// fused_swiglu_backward.
FusionRule swiglu_fusion_rule();

// Why the silu node `silu` and the nodes around it may not be fused; empty when they may.
std::string swiglu_fusion_blocker(const Graph& graph, NodeId silu);

}  // namespace qg
