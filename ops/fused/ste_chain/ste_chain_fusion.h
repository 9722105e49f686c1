// The fuse_ste_chain rule (ste_chain_fusion.cpp), registered on fused_ste_chain.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses ste_backward -> ste_backward pairs into one fused_ste_chain node (both masks in one
// pass; see the .cpp for the legality predicate).
FusionRule ste_chain_fusion_rule();

// Why an (ste_backward, ste_backward) pair may not be fused; empty when it may.
std::string ste_chain_fusion_blocker(const Graph& graph, NodeId first, NodeId second);

}  // namespace qg
