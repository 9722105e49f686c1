// The fuse_ste_backward rule (ste_backward_fusion.cpp), registered on fused_ste_backward.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses ste_backward -> activation backward (relu, gelu, silu) chains into one
// fused_ste_backward node (see the .cpp for the legality predicate).
FusionRule ste_backward_fusion_rule();

// Why an (ste_backward, activation backward) pair may not be fused; empty when it may.
std::string ste_fusion_blocker(const Graph& graph, NodeId ste, NodeId consumer);

}  // namespace qg
