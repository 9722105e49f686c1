// StaticRun: a graph prepared once for repeated launches. Every node's kernel, inputs,
// outputs and states are bound once, so a launch is just the kernel calls in order: no
// allocation, no host synchronisation, no per-run validation. This is what benchmarks time
// and what capture() records as a CUDA graph. Build and validate with an Executor first;
// StaticRun shares that executor's state (observer statistics, parameters).
//
// Memory: node outputs are views into one arena laid out by the memory planner
// (runtime/memory_plan.h), so values whose lifetimes do not overlap share bytes and every
// address is fixed. Temporaries that kernels allocate come from a scratch pool recorded on
// the first launch (runtime/scratch_pool.h). With plan_memory = false every output gets its
// own buffer instead (the planner's reference point in tests).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda_graph.h"
#include "runtime/executor.h"
#include "runtime/memory_plan.h"
#include "runtime/scratch_pool.h"

namespace qg {

class StaticRun {
 public:
  // `fetches` and `targets` (side-effect nodes such as optimizer steps) decide which nodes
  // run; `feeds` bind the graph inputs. With `validate`, the constructor runs the step once
  // through the executor to validate it (which advances state like any run); without it, the
  // caller has run these fetches and targets through the executor already (compile() does:
  // that run is its first step). Kernels see the executor's training flag as it is now, on
  // every launch. The executor must outlive this object.
  StaticRun(Executor& executor, const Executor::Feeds& feeds, const std::vector<ValueId>& fetches,
            const std::vector<NodeId>& targets = {}, bool plan_memory = true, bool validate = true);
  ~StaticRun();

  // Rebinds one graph input to another tensor of the same type (e.g. to rotate inputs).
  // Not allowed once captured: the graph reads the bound tensor's address.
  void bind_input(const std::string& name, const Tensor& value);
  // Copies `value` into the tensor bound to input `name` (same address; works after capture).
  void write_input(const std::string& name, const Tensor& value);
  // Launches every kernel once, in order. On CUDA this only enqueues work.
  void launch();

  // Records one launch as a CUDA graph (nothing runs while capturing). Needs at least one
  // launch() before it: that launch records the scratch temporaries and performs the
  // one-time set-up some kernels do on first use (library handles, error buffers).
  void capture();
  // Enqueues the captured graph once: the same work as launch().
  void replay();
  bool captured() const { return graph_.captured(); }
  int graph_nodes() const { return graph_.num_nodes(); }
  // Waits for the device and raises errors that kernels recorded on it (bad qparams, labels
  // out of range), as Executor::run does at its end.
  void synchronize();

  const Tensor& value(ValueId id) const { return values_.at(id); }
  int kernels_per_launch() const { return static_cast<int>(steps_.size()); }
  const MemoryPlan& plan() const { return plan_; }
  bool memory_planned() const { return planned_; }
  int64_t scratch_bytes() const { return scratch_->bytes(); }

 private:
  struct Step {
    NodeId node;
    const KernelDef* kernel;
    std::shared_ptr<const PreparedArgs> prepared;  // parsed once, when the run is built
  };
  Executor& exec_;
  bool planned_;
  bool training_;
  MemoryPlan plan_;
  Tensor arena_;
  std::unique_ptr<ScratchPool> scratch_;  // declared before values_: outlives them
  std::vector<Step> steps_;
  std::vector<Tensor> values_;
  std::map<std::string, ValueId> input_ids_;
  CudaGraph graph_;
  bool launched_ = false;
};

}  // namespace qg
