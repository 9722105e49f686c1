// The executor runs a graph on one backend. Graph inputs are fed by name and outputs fetched
// by name (or value id); persistent state (parameters, observer statistics, flags) lives on
// the device and survives between runs. Only the nodes the fetches and targets need run.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace qg {

class Executor {
 public:
  using Feeds = std::map<std::string, Tensor>;

  // `options` set up the executor's DeviceContext: its precision flags (TF32), and on CUDA
  // a stream to borrow instead of creating one.
  explicit Executor(const Graph& graph, Device device = Device::cpu(),
                    const ContextOptions& options = {});
  ~Executor();

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  Device device() const;
  const Graph& graph() const { return graph_; }
  void* stream() const { return backend_->stream(); }  // cudaStream_t on CUDA, else null
  // The device state its kernels run with; e.g. context().set_allow_tf32(true) lets the
  // GEMMs and convolutions of later runs use TF32.
  DeviceContext& context() const { return backend_->context(); }

  // Runs what `fetches` and `targets` (nodes run for their side effects, such as optimizer
  // steps) need. Returned tensors live on the executor's device.
  std::vector<Tensor> run(const Feeds& feeds, const std::vector<ValueId>& fetches,
                          const std::vector<NodeId>& targets = {});
  std::map<std::string, Tensor> run_named(const Feeds& feeds,
                                          const std::vector<std::string>& fetches,
                                          const std::vector<NodeId>& targets = {});
  // Runs every live node and returns every value (indexed by ValueId); for cross-checks.
  std::vector<Tensor> run_all(const Feeds& feeds);

  Tensor& state(NodeId node, const std::string& name);
  const std::vector<Tensor>& states(NodeId node);
  // The same, writable: a caller may replace a state by another tensor of its type (compile's
  // share_states) before any StaticRun binds it.
  std::vector<Tensor>& mutable_states(NodeId node);
  // Parameter values by name (on the executor's device).
  Tensor& parameter(const std::string& name);

  // Called after each node runs, with its outputs (cross-check and debugging hooks).
  std::function<void(const Node&, const std::vector<Tensor>&)> on_node;

 private:
  void prepare();
  std::vector<bool> needed_nodes(const std::vector<ValueId>& fetches,
                                 const std::vector<NodeId>& targets) const;
  void execute(const Feeds& feeds, const std::vector<bool>& needed, std::vector<Tensor>& values,
               const std::vector<ValueId>& keep);
  void run_nodes(const Feeds& feeds, const std::vector<bool>& needed, std::vector<Tensor>& values,
                 const std::vector<int>& last_use);

  const Graph& graph_;
  std::unique_ptr<Backend> backend_;
  bool training_ = true;
  int prepared_nodes_ = 0;
  std::vector<NodeId> order_;
  std::vector<std::vector<Tensor>> states_;                    // per node
  std::vector<const KernelDef*> kernels_;                      // per node
  std::vector<std::shared_ptr<const PreparedArgs>> prepared_;  // per node: parsed arguments
};

}  // namespace qg
