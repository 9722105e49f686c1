#pragma once

#include "runtime/passes/pass.h"

namespace qg {

// Fuses observer -> (scale, zero_point) -> quantizer chains on the same value into one
// fused_observe_quantize node (see the .cpp for the legality predicate).
class FuseObserverQuantizePass final : public Pass {
 public:
  const char* name() const override { return "fuse_observer_quantize"; }
  int run(Graph& graph) override;
};

// Why a (observer, quantizer) pair may not be fused; empty when it may.
std::string fusion_blocker(const Graph& graph, NodeId observer, NodeId quantizer);

}  // namespace qg
