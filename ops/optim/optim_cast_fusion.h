// The fuse_grad_cast rule (optim_cast_fusion.cpp), registered on adam: the fused node is the
// optimizer step itself (adam or sgd), reading the narrow gradient.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses the widening cast (bf16/f16 -> f32) of an f32 parameter's gradient into the adam or
// sgd step that reads it.
FusionRule grad_cast_fusion_rule();

// Why the step `step` may not read its gradient's narrow source; empty when it may.
std::string grad_cast_fusion_blocker(const Graph& graph, NodeId step);

}  // namespace qg
