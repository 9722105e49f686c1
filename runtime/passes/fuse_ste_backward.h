#pragma once

#include "runtime/passes/pass.h"

namespace qg {

// Fuses ste_backward -> activation backward (relu, gelu, silu) chains into one
// fused_ste_backward node (see the .cpp for the legality predicate).
class FuseSteBackwardPass final : public Pass {
 public:
  const char* name() const override { return "fuse_ste_backward"; }
  int run(Graph& graph) override;
};

// Why an (ste_backward, activation backward) pair may not be fused; empty when it may.
std::string ste_fusion_blocker(const Graph& graph, NodeId ste, NodeId consumer);

}  // namespace qg
