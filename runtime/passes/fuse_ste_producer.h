#pragma once

#include <string>

#include "runtime/passes/pass.h"

namespace qg {

// Fuses an element-wise producer (permute, transpose, same-shape add) -> [reshape views] ->
// ste_backward chain into one fused_ste_producer node (see the .cpp for the legality
// predicate).
class FuseSteProducerPass final : public Pass {
 public:
  const char* name() const override { return "fuse_ste_producer"; }
  int run(Graph& graph) override;
};

// Why the producer of `ste`'s dy (found through reshape nodes) may not be fused into it; empty
// when it may.
std::string ste_producer_fusion_blocker(const Graph& graph, NodeId ste);

}  // namespace qg
