#pragma once

#include <string>

#include "runtime/passes/pass.h"

namespace qg {

// Fuses mul-by-a-scalar -> last-axis softmax into fused_scaled_softmax, and
// softmax_backward -> mul-by-a-scalar into fused_scaled_softmax_backward (see the .cpp for
// the legality predicates).
class FuseScaledSoftmaxPass final : public Pass {
 public:
  const char* name() const override { return "fuse_scaled_softmax"; }
  int run(Graph& graph) override;
};

// Why a (mul, softmax) pair may not be fused; empty when it may.
std::string scaled_softmax_blocker(const Graph& graph, NodeId mul, NodeId softmax);
// Why a (softmax_backward, mul) pair may not be fused; empty when it may.
std::string scaled_softmax_backward_blocker(const Graph& graph, NodeId softmax_backward,
                                            NodeId mul);

}  // namespace qg
