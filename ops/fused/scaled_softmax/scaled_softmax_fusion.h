// The fuse_scaled_softmax rule (scaled_softmax_fusion.cpp), registered on
// fused_scaled_softmax.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses mul-by-a-scalar -> last-axis softmax into fused_scaled_softmax, and
// softmax_backward -> mul-by-a-scalar into fused_scaled_softmax_backward (see the .cpp for
// the legality predicates).
FusionRule scaled_softmax_fusion_rule();

// Why a (mul, softmax) pair may not be fused; empty when it may.
std::string scaled_softmax_blocker(const Graph& graph, NodeId mul, NodeId softmax);
// Why a (softmax_backward, mul) pair may not be fused; empty when it may.
std::string scaled_softmax_backward_blocker(const Graph& graph, NodeId softmax_backward,
                                            NodeId mul);

}  // namespace qg
