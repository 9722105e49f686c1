// The fuse_ste_mul_pair rule (ste_mul_pair_fusion.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"

namespace qg {

// Why the ste_backward `ste` and the two muls that read its masked gradient (through reshape
// views) may not become one fused_ste_mul_pair node; empty when they may.
std::string ste_mul_pair_fusion_blocker(const Graph& graph, NodeId ste);

FusionRule ste_mul_pair_fusion_rule();

}  // namespace qg
