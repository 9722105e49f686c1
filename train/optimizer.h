// Optimizers as graph nodes: add_optimizer() differentiates the loss with respect to the
// parameters (autograd appends the backward graph) and appends one update node per
// parameter (`sgd`, `adam` or `adamw`), ordered after every reader of that parameter by
// control dependencies so the in-place update never races a read of the old value. Run the
// returned nodes as Executor::run targets: one run = forward + backward + update.
//
// adamw (and adam with runtime_lr or clipping) reads its rate from one f64 variable,
// kLearningRateName, that set_learning_rate() writes between runs: a schedule then needs
// no recompile, and a CUDA-graph replay reads the new value. With clip_grad_norm > 0 one
// clip_grad_norm node over every gradient feeds its clip coefficient to every update, and
// its total norm (kGradNormName) may be fetched. A builder applied to a subset of the
// parameters (ZeRO sharding) clips by the norm of that subset only, so sharded training
// rejects clipping.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/graph.h"
#include "runtime/compile.h"

namespace qg::nn {

struct OptimizerConfig {
  std::string kind = "adam";  // "adam", "adamw" or "sgd"
  double lr = 1e-3;           // the rate; with a runtime rate, the variable's initial value
  double momentum = 0.9;      // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  // adam, sgd: an L2 term added to the gradient; adamw: decoupled (p *= 1 - lr * wd).
  double weight_decay = 0.0;
  // > 0: scale the gradients by min(1, max_norm / (total L2 norm + 1e-6)) before the update,
  // as torch.nn.utils.clip_grad_norm_ (adam, adamw); 0: off.
  double clip_grad_norm = 0.0;
  // adam: read the rate from the variable as adamw does (the same update, bit for bit).
  bool runtime_lr = false;
  // Parameters (by name) whose rate is the rate times a factor; the others take the rate.
  // Learned weight ranges use it: their scales are far smaller than the weights, and Adam's
  // step is about the rate whatever the parameter's size (nn/learned_ranges.h).
  std::map<std::string, double> lr_factors = {};

  // Whether the rate is the kLearningRateName variable rather than an attribute.
  bool has_runtime_lr() const;
  // Throws qg::Error (op "nn.optimizer") naming the field out of range.
  void validate() const;
};

// The names of the runtime rate's variable and of the fetchable total gradient norm.
inline constexpr const char* kLearningRateName = "optimizer.lr";
inline constexpr const char* kGradNormName = "optimizer.grad_norm";

// Returns the optimizer step nodes (one per parameter).
std::vector<NodeId> add_optimizer(Graph& graph, ValueId loss, const std::vector<ValueId>& params,
                                  const OptimizerConfig& config);
// The update-node builder compile() takes (TrainingSpec::optimizer): the same nodes
// add_optimizer appends once the gradients exist. Throws for an unknown kind or a field out
// of range.
OptimizerNodes optimizer_nodes(const OptimizerConfig& config);

// Writes the runtime rate of `exec`'s graph (before a run; it takes effect at that run).
// Throws when the graph has no rate variable or `lr` is negative or not finite.
void set_learning_rate(Executor& exec, double lr);
// The fetchable total gradient norm of a graph with clipping; kNoValue without.
ValueId grad_norm_value(const Graph& graph);

}  // namespace qg::nn
