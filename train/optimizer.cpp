#include "train/optimizer.h"

#include "autograd/grad.h"
#include "core/error.h"

namespace qg::nn {

OptimizerNodes optimizer_nodes(const OptimizerConfig& config) {
  Attrs attrs;
  if (config.kind == "adam") {
    attrs = {{"lr", config.lr},
             {"beta1", config.beta1},
             {"beta2", config.beta2},
             {"eps", config.eps},
             {"weight_decay", config.weight_decay}};
  } else if (config.kind == "sgd") {
    attrs = {
        {"lr", config.lr}, {"momentum", config.momentum}, {"weight_decay", config.weight_decay}};
  } else {
    QG_FAIL("nn.optimizer", "optimizer '", config.kind, "' is not one of adam, sgd");
  }
  const std::string kind = config.kind;
  return [attrs, kind](Graph& graph, const std::vector<ValueId>& params,
                       const std::vector<ValueId>& grads) {
    QG_CHECK(params.size() == grads.size(), "nn.optimizer", params.size(), " parameters but ",
             grads.size(), " gradients");
    std::vector<NodeId> steps;
    for (size_t i = 0; i < params.size(); ++i) {
      // Readers are collected before the step node exists, so it is not its own dependency.
      std::vector<NodeId> readers = graph.consumers(params[i]);
      graph.apply(kind, {params[i], grads[i]}, attrs, graph.value(params[i]).name + "." + kind);
      // The step has no outputs; with Boost's vecS storage it is the newest vertex.
      NodeId step = graph.num_nodes() - 1;
      for (NodeId r : readers) graph.add_control_dependency(r, step);
      steps.push_back(step);
    }
    // A reader of parameter j may also be a node step i depends on; ordering each step after
    // all readers of its own parameter is enough because steps only write their own
    // parameter.
    return steps;
  };
}

std::vector<NodeId> add_optimizer(Graph& graph, ValueId loss, const std::vector<ValueId>& params,
                                  const OptimizerConfig& config) {
  OptimizerNodes build = optimizer_nodes(config);  // an unknown kind fails before autograd
  for (ValueId p : params)
    QG_CHECK(graph.node(graph.value(p).producer).op->name == "parameter", "nn.optimizer", "value '",
             graph.value(p).name, "' is not a parameter");
  return build(graph, params, grad(graph, loss, params));
}

}  // namespace qg::nn
