#pragma once

#include "runtime/passes/pass.h"

namespace qg {

// Moves an element-wise activation (relu, gelu, silu) whose only reader is a
// fused_observe_quantize node into that node, which then applies it to x as it loads it
// (see the .cpp for the legality predicate). Runs after fuse_observer_quantize.
class FuseActivationProloguePass final : public Pass {
 public:
  const char* name() const override { return "fuse_activation_prologue"; }
  int run(Graph& graph) override;
};

// Why the activation node `act` may not move into the fused node `fused`; empty when it may.
std::string prologue_fusion_blocker(const Graph& graph, NodeId act, NodeId fused);

}  // namespace qg
