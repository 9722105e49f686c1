// compile(): the one road from a built graph to a step that runs fast. Every caller that
// runs a model more than once (nn::Trainer and so `qat train` and Python's nn.train, `qat
// steps`, the benchmarks, evaluation) goes through it, so what the benchmarks time is what
// training runs:
//
//   graph --1. autograd (loss -> parameter gradients), then activation recomputation of
//              the regions the training spec names (autograd/recompute.h)
//         --2. gradient sync (rewrites the gradients; data-parallel all-reduce; empty for
//              one process)
//         --3. optimizer nodes (one update per parameter)
//         --4. optimize(): the fusion passes (QG_DISABLE_PASSES applies)
//         --5. per run mode, on first use: the executor's validated run (that run is the
//              first step), then a StaticRun over the memory plan, captured as a CUDA graph
//              on the GPU and replayed from the third call on.
//
// Shapes are fixed when a graph is built, so a compiled step serves one shape; callers that
// meet several (the last, smaller batch of an epoch) compile one per shape and make their
// persistent state one set of tensors with share_states().
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/recompute.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "runtime/static_run.h"

namespace qg {

// Appends the optimizer's update nodes for (parameter, gradient) pairs; returns them. The
// update ops live in ops/optim; nn::optimizer_nodes builds one from an OptimizerConfig.
using OptimizerNodes = std::function<std::vector<NodeId>(Graph&, const std::vector<ValueId>& params,
                                                         const std::vector<ValueId>& grads)>;
// Rewrites the parameter gradients before the optimizer reads them (the data-parallel
// all-reduce); returns the gradients the optimizer reads. Empty: one process.
using GradientSync = std::function<std::vector<ValueId>(Graph&, const std::vector<ValueId>& grads)>;

struct TrainingSpec {
  ValueId loss = kNoValue;  // kNoValue: a forward-only program (evaluation, calibration)
  std::vector<ValueId> parameters;
  OptimizerNodes optimizer;  // required with a loss
  GradientSync gradient_sync;
  // Forward regions whose activations the backward recomputes instead of keeping (a model's
  // decoder blocks, in forward order); empty: every activation the backward reads is kept.
  std::vector<RecomputeRegion> recompute = {};
};

// False when QG_CUDA_GRAPH is 0 (CompileOptions::cuda_graph's default), else true.
bool cuda_graph_from_environment();

struct CompileOptions {
  Device device = Device::cpu();
  ContextOptions context;  // the executor's device context: stream, precision flags
  PassOptions passes = PassOptions::from_env();
  bool plan_memory = true;  // false: every value gets its own buffer (the planner's reference)
  // On CUDA: capture each run mode and replay it. QG_CUDA_GRAPH=0 in the environment turns
  // it off (every step launched kernel by kernel), to tell what the graph changes.
  bool cuda_graph = cuda_graph_from_environment();
  // Values any run may fetch, by the ids they had when the graph was built. They are marked
  // as graph outputs before the passes, so no fusion removes them (one may rebuild their
  // producer; runs still fetch them by these ids).
  std::vector<ValueId> outputs;
};

// How one run mode of a compiled step was last executed (tests and `qat steps` read it).
enum class RunPath { executor, launch, replay };

class CompiledStep {
 public:
  // Compiles `graph` in place (autograd, sync, optimizer nodes and passes are added to it);
  // the graph must outlive this object. Throws qg::Error when the spec does not fit the graph.
  CompiledStep(Graph& graph, const TrainingSpec& training, const CompileOptions& options);
  ~CompiledStep();
  CompiledStep(const CompiledStep&) = delete;
  CompiledStep& operator=(const CompiledStep&) = delete;

  // One training step (forward, backward, gradient sync, optimizer) in training mode.
  // Returns the fetched values on the device: views that the next run of this mode
  // overwrites. Feeds are copied into the step's own input buffers, so the caller's tensors
  // may be reused at once; an input not fed keeps the value it was last fed (a timing loop
  // feeds once). Asynchronous on CUDA: call synchronize() before trusting the results.
  const std::vector<Tensor>& train(const Executor::Feeds& feeds,
                                   const std::vector<ValueId>& fetches);
  // Forward only, no update: eval mode (observers and batch norms frozen) with
  // `training` false, calibration (observers record) with `training` true.
  const std::vector<Tensor>& forward(const Executor::Feeds& feeds,
                                     const std::vector<ValueId>& fetches, bool training);
  // Waits for the device and raises the errors kernels recorded there (bad qparams, labels
  // out of range); a no-op on the CPU, whose kernels throw directly.
  void synchronize();

  Graph& graph() { return graph_; }
  Executor& executor() { return *exec_; }
  Device device() const { return exec_->device(); }
  const std::vector<NodeId>& updates() const { return updates_; }
  const std::vector<PassRecord>& passes() const { return passes_; }
  // The last run of the mode that fetches `fetches` with these flags: how it ran, and how
  // many kernels one launch of it has (0 before its StaticRun exists).
  RunPath last_path(const std::vector<ValueId>& fetches, bool update, bool training) const;
  int kernels_per_launch(const std::vector<ValueId>& fetches, bool update, bool training) const;
  int64_t arena_bytes(const std::vector<ValueId>& fetches, bool update, bool training) const;
  // The arena the memory plan of that mode lays out (the StaticRun's, computed now without
  // running anything): the planned peak of one step's values.
  int64_t planned_arena_bytes(const std::vector<ValueId>& fetches, bool update, bool training);
  const RecomputeStats& recompute_stats() const { return recompute_; }

 private:
  struct Mode;
  using ModeKey = std::tuple<std::vector<ValueId>, bool, bool>;
  Mode& mode(const std::vector<ValueId>& fetches, bool update, bool training);
  const Mode* find_mode(const std::vector<ValueId>& fetches, bool update, bool training) const;
  const std::vector<Tensor>& run(Mode& m, const Executor::Feeds& feeds);
  void write_feeds(const Mode& m, const Executor::Feeds& feeds);

  Graph& graph_;
  CompileOptions options_;
  std::vector<NodeId> updates_;
  std::vector<PassRecord> passes_;
  RecomputeStats recompute_;
  std::unique_ptr<Executor> exec_;
  std::map<std::string, Tensor> inputs_;  // the step's own input buffers, by input name
  std::set<std::string> fed_;             // inputs written at least once
  std::map<ValueId, ValueId> outputs_;    // CompileOptions::outputs -> their ids after the passes
  std::map<ModeKey, std::unique_ptr<Mode>> modes_;
};

// Every persistent state of `exec` (parameters, optimizer moments, observer statistics,
// flags; constants excluded) by its key "<node>/<state>", where <node> is the name of the
// node as the graph was built: a fused node's states are keyed by the nodes it took in, so
// keys do not depend on which passes ran.
std::map<std::string, Tensor*> state_index(Executor& exec);
// Makes every state of `to` the very tensor `from` holds under the same key (one set of
// device buffers for programs compiled at several shapes). Call it before `to` runs. Throws
// naming the key when `from` lacks one or it differs in dtype or shape.
void share_states(Executor& from, Executor& to);

}  // namespace qg
