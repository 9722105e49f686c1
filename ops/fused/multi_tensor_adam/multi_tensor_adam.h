// The multi-tensor Adam step (see multi_tensor_adam_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Checks the fused node's inputs against its parts (qg::Error naming the op otherwise): one
// (param, grad) pair per adam part, the params of one dtype (f32 or f64), the grads of one
// dtype (the params', or bf16/f16 for f32 params), each grad of its param's shape.
void check_multi_tensor_adam_inputs(const KernelContext& ctx);

// The fuse_multi_tensor_adam rule (multi_tensor_adam_fusion.cpp).
FusionRule multi_tensor_adam_fusion_rule();

// Why the adam steps `steps` may not become one node; empty when they may.
std::string multi_tensor_adam_blocker(const Graph& graph, const std::vector<NodeId>& steps);

// Registers fused_multi_tensor_adam with its fusion rule (called by define_fused_ops).
void define_fused_multi_tensor_adam_op(OpRegistry& r);

}  // namespace qg
