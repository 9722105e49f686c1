// The fuse_ste_producer rule (ste_producer_fusion.cpp), registered on fused_ste_producer.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses an element-wise producer (permute, transpose, same-shape add) -> [reshape views] ->
// ste_backward chain into one fused_ste_producer node (see the .cpp for the legality
// predicate).
FusionRule ste_producer_fusion_rule();

// Why the producer of `ste`'s dy (found through reshape nodes) may not be fused into it; empty
// when it may.
std::string ste_producer_fusion_blocker(const Graph& graph, NodeId ste);

}  // namespace qg
