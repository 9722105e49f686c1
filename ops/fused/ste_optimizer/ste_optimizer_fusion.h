// The fuse_ste_optimizer rule (ste_optimizer_fusion.cpp), registered on fused_ste_optimizer.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses ste_backward -> optimizer step (sgd, adam) into one fused_ste_optimizer node: a
// fake-quantized weight's masked gradient applied straight to the parameter (see the .cpp
// for the legality predicate).
FusionRule ste_optimizer_fusion_rule();

// Why an (ste_backward, optimizer step) pair may not be fused; empty when it may.
std::string ste_optimizer_fusion_blocker(const Graph& graph, NodeId ste, NodeId step);

}  // namespace qg
