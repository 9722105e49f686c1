// The multi-tensor cast of the parameters (see multi_tensor_cast_op.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Tensors one CUDA launch takes: their pointers and sizes travel in the kernel's parameters,
// which stay within the classic 4 KiB limit at this count.
inline constexpr int kMultiCastChunk = 48;

// Checks the fused node's tensors (qg::Error naming the op otherwise): one input and one output
// per cast part, of one source and one destination dtype, each output with its input's shape.
void check_multi_tensor_cast_inputs(const KernelContext& ctx);

// The fuse_multi_tensor_cast rule (multi_tensor_cast_fusion.cpp).
FusionRule multi_tensor_cast_fusion_rule();

// Why the casts `casts` may not become one node; empty when they may.
std::string multi_tensor_cast_blocker(const Graph& graph, const std::vector<NodeId>& casts);

// Registers fused_multi_tensor_cast with its fusion rule (called by define_fused_ops).
void define_fused_multi_tensor_cast_op(OpRegistry& r);

}  // namespace qg
