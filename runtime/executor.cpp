#include "runtime/executor.h"

#include <algorithm>

#include "core/error.h"
#include "core/output_name.h"

namespace qg {
namespace {

// A copy of `t` on the context's device, queued on the context's stream so that it is
// ordered with the kernels run there.
Tensor copy_to(DeviceContext& context, const Tensor& t) {
  QG_CHECK(t.defined(), "tensor", "copy of an undefined tensor");
  QG_CHECK(t.is_contiguous(), "tensor", "copy of a non-contiguous tensor");
  Tensor out = Tensor::empty(t.shape(), t.dtype(), context.device());
  context.copy(out.raw_data(), out.device(), t.raw_data(), t.device(), t.nbytes());
  return out;
}

}  // namespace

Executor::Executor(const Graph& graph, Device device, const ContextOptions& options)
    : graph_(graph), backend_(make_backend(device, options)) {
  prepare();
}

Executor::~Executor() = default;

Device Executor::device() const {
  return backend_->device();
}

// Orders the graph, picks a kernel for every node (failing before anything runs when one is
// missing), and creates the state of nodes added since the last call.
void Executor::prepare() {
  context().make_current();
  order_ = graph_.topological_order();
  int n = graph_.num_nodes();
  states_.resize(n);
  kernels_.resize(n, nullptr);
  prepared_.resize(n);
  for (NodeId id : order_) {
    const Node& node = graph_.node(id);
    kernels_[id] = &backend_->kernel_for(*node.op, graph_.input_dtypes(node));
    if (id >= prepared_nodes_ || !prepared_[id]) prepared_[id] = graph_.prepare_args(node);
    if (id < prepared_nodes_ || node.states.empty()) continue;
    std::vector<Tensor>& st = states_[id];
    for (const StateSpec& spec : node.states) {
      Tensor host;
      if (spec.name == "value" && node.value.defined()) {
        host = node.value;
      } else {
        host = Tensor::empty(spec.type.shape, spec.type.dtype);
        host.fill(spec.init);
      }
      st.push_back(copy_to(context(), host));
    }
  }
  prepared_nodes_ = n;
}

std::vector<bool> Executor::needed_nodes(const std::vector<ValueId>& fetches,
                                         const std::vector<NodeId>& targets) const {
  return graph_.needed_nodes(fetches, targets);
}

void Executor::execute(const Feeds& feeds, const std::vector<bool>& needed,
                       std::vector<Tensor>& values, const std::vector<ValueId>& keep) {
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  for (const auto& [name, t] : feeds) {
    ValueId v = graph_.find(name);
    QG_CHECK(v != kNoValue && graph_.node(graph_.value(v).producer).op->name == "input", "executor",
             "feed '", name, "' does not name a graph input");
  }
  // Last position at which each value is read, so intermediates are released early.
  std::vector<int> last_use(graph_.num_values(), -1);
  for (size_t p = 0; p < order_.size(); ++p)
    if (needed[order_[p]])
      for (ValueId in : graph_.node(order_[p]).inputs) last_use[in] = static_cast<int>(p);
  for (ValueId k : keep) last_use[k] = static_cast<int>(order_.size());

  values.assign(graph_.num_values(), Tensor());
  context().make_current();
  try {
    run_nodes(feeds, needed, values, last_use);
  } catch (...) {
    // Device-side errors of the failed run are consumed here so they are not reported
    // against a later run; the first exception is the one that propagates.
    try {
      backend_->after_run(graph_);
    } catch (...) {
    }
    throw;
  }
  backend_->after_run(graph_);
}

void Executor::run_nodes(const Feeds& feeds, const std::vector<bool>& needed,
                         std::vector<Tensor>& values, const std::vector<int>& last_use) {
  for (size_t p = 0; p < order_.size(); ++p) {
    NodeId id = order_[p];
    if (!needed[id]) continue;
    const Node& node = graph_.node(id);
    std::vector<Tensor> outputs;
    for (ValueId out : node.outputs) {
      const TensorType& t = graph_.value(out).type;
      outputs.push_back(node.op->is_source ? Tensor::empty(t.shape, t.dtype, Device::cpu())
                                           : Tensor::empty(t.shape, t.dtype, device()));
    }
    std::vector<Tensor> inputs;
    for (ValueId in : node.inputs) inputs.push_back(values[in]);
    KernelContext ctx(node.op->name, *prepared_[id], node.attrs, std::move(inputs),
                      std::move(outputs), states_[id], context(), training_);
    ctx.site = id;
    ctx.site_name = &node.name;
    Tensor feed;
    if (node.op->name == "input") {
      auto it = feeds.find(node.name);
      if (it != feeds.end()) {
        QG_CHECK(it->second.defined(), "input", "graph input '", node.name,
                 "' was fed an undefined tensor");
        feed = it->second.device() == device() ? it->second : copy_to(context(), it->second);
        ctx.feed = &feed;
      }
    }
    kernels_[id]->fn(ctx);
    backend_->after_kernel(node);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const TensorType& t = graph_.value(node.outputs[i]).type;
      const Tensor& got = ctx.outputs[i];
      QG_CHECK(got.defined() && got.dtype() == t.dtype && got.shape() == t.shape &&
                   got.device() == device(),
               node.op->name, "kernel produced ", got.defined() ? got.str() : "nothing",
               " for output '", output_name(*node.op, i), "' declared ", t.str(), " on ",
               device().str());
      values[node.outputs[i]] = got;
    }
    if (on_node) on_node(node, ctx.outputs);
    for (ValueId in : node.inputs)
      if (last_use[in] == static_cast<int>(p)) values[in] = Tensor();
  }
}

std::vector<Tensor> Executor::run(const Feeds& feeds, const std::vector<ValueId>& fetches,
                                  const std::vector<NodeId>& targets) {
  for (ValueId v : fetches) {
    const Node& producer = graph_.node(graph_.value(v).producer);
    QG_CHECK(!producer.dead, "executor", "value ", v, " was produced by node '", producer.name,
             "', which a pass removed (fused away); fetch it by name or re-read the value id");
  }
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  std::vector<Tensor> values;
  execute(feeds, needed_nodes(fetches, targets), values, fetches);
  std::vector<Tensor> out;
  for (ValueId v : fetches) out.push_back(values[v]);
  return out;
}

std::map<std::string, Tensor> Executor::run_named(const Feeds& feeds,
                                                  const std::vector<std::string>& fetches,
                                                  const std::vector<NodeId>& targets) {
  std::vector<ValueId> ids;
  for (const auto& name : fetches) ids.push_back(graph_.at(name));
  std::vector<Tensor> got = run(feeds, ids, targets);
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < fetches.size(); ++i) out[fetches[i]] = got[i];
  return out;
}

std::vector<Tensor> Executor::run_all(const Feeds& feeds) {
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  std::vector<bool> needed(graph_.num_nodes(), false);
  for (NodeId id : order_) needed[id] = true;
  std::vector<ValueId> all(graph_.num_values());
  for (int i = 0; i < graph_.num_values(); ++i) all[i] = i;
  std::vector<Tensor> values;
  execute(feeds, needed, values, all);
  return values;
}

Tensor& Executor::state(NodeId node, const std::string& name) {
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  const Node& n = graph_.node(node);
  for (size_t i = 0; i < n.states.size(); ++i)
    if (n.states[i].name == name) return states_[node].at(i);
  QG_FAIL(n.op->name, "node '", n.name, "' has no state named '", name, "'");
}

const std::vector<Tensor>& Executor::states(NodeId node) {
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  graph_.node(node);
  return states_[node];
}

std::vector<Tensor>& Executor::mutable_states(NodeId node) {
  if (graph_.num_nodes() != prepared_nodes_) prepare();
  graph_.node(node);
  return states_[node];
}

Tensor& Executor::parameter(const std::string& name) {
  ValueId v = graph_.at(name);
  NodeId n = graph_.value(v).producer;
  QG_CHECK(graph_.node(n).op->name == "parameter", "executor", "'", name, "' is not a parameter");
  return state(n, "value");
}

}  // namespace qg
