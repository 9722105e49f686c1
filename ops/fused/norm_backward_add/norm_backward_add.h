// The fused rms_norm backward + gradient accumulation ops (norm_backward_add_op.cpp) and the
// rule that makes them (norm_backward_add_fusion.cpp). Their CUDA kernels are rms_norm's own
// (ops/rms_norm/rms_norm_cuda.cu), which write the accumulated gradient instead of dx.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Checks what the fused kernels rely on (a qg::Error naming the op otherwise): the parts
// {rms_norm_backward, add[, cast]}, the residual of dx's type, and y (and the narrow copy)
// of dx's shape.
void check_fused_norm_backward_add_inputs(const KernelContext& ctx);

// Registers fused_rms_norm_backward_add and fused_rms_norm_backward_add_cast.
void define_fused_norm_backward_add_ops(OpRegistry& r);

// Fuses rms_norm_backward -> add(residual, dx) [-> cast of the sum to bf16/f16].
FusionRule norm_backward_add_fusion_rule();

// Why the rms_norm_backward `node` may not be fused with the add that reads its dx; empty when
// it may.
std::string norm_backward_add_fusion_blocker(const Graph& graph, NodeId node);

}  // namespace qg
