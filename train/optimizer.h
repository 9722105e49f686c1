// Optimizers as graph nodes: add_optimizer() differentiates the loss with respect to the
// parameters (autograd appends the backward graph) and appends one `sgd` or `adam` node per
// parameter, ordered after every reader of that parameter by control dependencies so the
// in-place update never races a read of the old value. Run the returned nodes as
// Executor::run targets: one run = forward + backward + update.
#pragma once

#include <string>
#include <vector>

#include "core/graph.h"
#include "runtime/compile.h"

namespace qg::nn {

struct OptimizerConfig {
  std::string kind = "adam";  // "adam" or "sgd"
  double lr = 1e-3;
  double momentum = 0.9;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  double weight_decay = 0.0;
};

// Returns the optimizer step nodes (one per parameter).
std::vector<NodeId> add_optimizer(Graph& graph, ValueId loss, const std::vector<ValueId>& params,
                                  const OptimizerConfig& config);
// The update-node builder compile() takes (TrainingSpec::optimizer): the same nodes
// add_optimizer appends once the gradients exist. Throws for an unknown kind.
OptimizerNodes optimizer_nodes(const OptimizerConfig& config);

}  // namespace qg::nn
