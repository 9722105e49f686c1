#pragma once

#include "runtime/passes/pass.h"

namespace qg {

// Fuses ste_backward -> optimizer step (sgd, adam) into one fused_ste_optimizer node: a
// fake-quantized weight's masked gradient applied straight to the parameter (see the .cpp
// for the legality predicate).
class FuseSteOptimizerPass final : public Pass {
 public:
  const char* name() const override { return "fuse_ste_optimizer"; }
  int run(Graph& graph) override;
};

// Why an (ste_backward, optimizer step) pair may not be fused; empty when it may.
std::string ste_optimizer_fusion_blocker(const Graph& graph, NodeId ste, NodeId step);

// Fuses ste_backward -> ste_backward pairs into one fused_ste_chain node (both masks in one
// pass; see the .cpp for the legality predicate).
class FuseSteChainPass final : public Pass {
 public:
  const char* name() const override { return "fuse_ste_chain"; }
  int run(Graph& graph) override;
};

// Why an (ste_backward, ste_backward) pair may not be fused; empty when it may.
std::string ste_chain_fusion_blocker(const Graph& graph, NodeId first, NodeId second);

}  // namespace qg
