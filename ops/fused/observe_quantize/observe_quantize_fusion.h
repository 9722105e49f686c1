// The fusion rules that make and extend fused_observe_quantize nodes: fuse_observer_quantize
// (observer_quantize_fusion.cpp) and fuse_activation_prologue (activation_prologue_fusion.cpp).
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// fuse_observer_quantize: observer -> (scale, zero_point) -> quantizer on the same value
// into one fused_observe_quantize node.
FusionRule observe_quantize_fusion_rule();
// Why a (observer, quantizer) pair may not be fused; empty when it may.
std::string fusion_blocker(const Graph& graph, NodeId observer, NodeId quantizer);

// fuse_activation_prologue: an element-wise activation (relu, gelu, silu) whose only reader
// is a fused_observe_quantize node moves into that node, which applies it to x as it loads
// it. Runs after fuse_observer_quantize.
FusionRule activation_prologue_fusion_rule();
// Why the activation node `act` may not move into the fused node `fused`; empty when it may.
std::string prologue_fusion_blocker(const Graph& graph, NodeId act, NodeId fused);

}  // namespace qg
