// StaticRun: a graph prepared once for repeated launches. Every node's kernel, inputs,
// outputs and states are bound once, so a launch is just the kernel calls in order: no
// allocation, no host synchronisation, no per-run validation. This is what benchmarks time
// and what a captured CUDA graph would replay. Build and validate with an Executor first;
// StaticRun shares that executor's state (observer statistics, parameters).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/executor.h"

namespace qg {

class StaticRun {
 public:
  // `fetches` decide which nodes run; `feeds` bind the graph inputs (on the executor's
  // device). The executor must outlive this object.
  StaticRun(Executor& executor, const Executor::Feeds& feeds, const std::vector<ValueId>& fetches);

  // Rebinds one graph input to another tensor of the same type (e.g. to rotate inputs).
  void bind_input(const std::string& name, const Tensor& value);
  // Launches every kernel once, in order. On CUDA this only enqueues work.
  void launch();
  const Tensor& value(ValueId id) const { return values_.at(id); }
  int kernels_per_launch() const { return static_cast<int>(steps_.size()); }

 private:
  struct Step {
    NodeId node;
    const KernelDef* kernel;
  };
  Executor& exec_;
  std::vector<Step> steps_;
  std::vector<Tensor> values_;
  std::map<std::string, ValueId> input_ids_;
};

}  // namespace qg
