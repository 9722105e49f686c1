#include "runtime/compile.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "autograd/grad.h"
#include "core/error.h"
#include "core/graph_rewrite.h"
#include "device/communicator.h"
#include "runtime/memory_plan.h"

namespace qg {

bool cuda_graph_from_environment() {
  const char* v = std::getenv("QG_CUDA_GRAPH");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

namespace {

// The fused CUDA batch-norm kernel has no point between its statistics and their use where the
// ranks could combine theirs: with SyncBatchNorm on, CUDA ranks run the parts unfused. (The
// fused observer + quantizer syncs inside its kernel, or runs its parts: its CUDA dispatch
// decides per node. On the CPU the fused kernels sync themselves.)
PassOptions passes_for(const CompileOptions& o) {
  PassOptions passes = o.passes;
  const Communicator* comm = o.context.communicator;
  if (!o.device.is_cuda() || comm == nullptr || comm->world_size() < 2) return passes;
  if (o.context.sync_batch_norm) passes.disabled.insert("fuse_channel_div_batch_norm");
  return passes;
}

}  // namespace

// One way of running the compiled graph: what it fetches, whether the optimizer nodes run,
// and the training flag its kernels see. Its StaticRun is built on its second call.
struct CompiledStep::Mode {
  std::vector<ValueId> fetches;
  std::vector<NodeId> targets;
  bool training = true;
  std::vector<std::string> needed_inputs;
  int calls = 0;
  std::unique_ptr<StaticRun> run;
  std::vector<Tensor> results;
  RunPath path = RunPath::executor;
};

CompiledStep::CompiledStep(Graph& graph, const TrainingSpec& training,
                           const CompileOptions& options)
    : graph_(graph), options_(options) {
  // Passes may replace an output's producer; the value then lives on under a new id with
  // the same name, so each output is named (if it is not) and found by name afterwards.
  std::vector<std::string> output_names;
  for (ValueId v : options_.outputs) {
    graph_.mark_output(v);
    if (graph_.value(v).name.empty()) graph_.set_name(v, "compile.output." + std::to_string(v));
    output_names.push_back(graph_.value(v).name);
  }
  if (training.loss != kNoValue) {
    QG_CHECK(static_cast<bool>(training.optimizer), "compile",
             "a loss is given but no optimizer to apply its gradients");
    QG_CHECK(!training.parameters.empty(), "compile", "a loss is given but no parameters");
    // 1. autograd (and recomputation), 2. gradient sync, 3. optimizer nodes.
    const NodeId backward_begin = graph_.num_nodes();
    GradientMap value_grads;
    std::vector<ValueId> grads =
        training.recompute.empty()
            ? grad(graph_, training.loss, training.parameters)
            : grad_with_value_grads(graph_, training.loss, training.parameters, value_grads);
    if (!training.recompute.empty())
      recompute_ = recompute_regions(graph_, training.recompute, backward_begin, graph_.num_nodes(),
                                     value_grads);
    if (training.gradient_sync) {
      grads = training.gradient_sync(graph_, grads);
      QG_CHECK(grads.size() == training.parameters.size(), "compile", "gradient sync returned ",
               grads.size(), " gradients for ", training.parameters.size(), " parameters");
    }
    updates_ = training.optimizer(graph_, training.parameters, grads);
  }
  // 4. the fusion passes; the fetchable outputs were marked above, so their ids hold.
  passes_ = optimize(graph_, passes_for(options_));
  // A pass may merge update nodes (fuse_multi_tensor_adamw): their ids now lead to the fused
  // node, run once.
  std::vector<NodeId> live;
  for (NodeId u : updates_) {
    const NodeId n = live_node(graph_, u);
    if (std::find(live.begin(), live.end(), n) == live.end()) live.push_back(n);
  }
  updates_ = std::move(live);
  for (size_t i = 0; i < options_.outputs.size(); ++i)
    outputs_[options_.outputs[i]] = graph_.at(output_names[i]);
  exec_ = std::make_unique<Executor>(graph_, options_.device, options_.context);
  for (ValueId v : graph_.inputs()) {
    const Value& in = graph_.value(v);
    inputs_[graph_.node(in.producer).name] =
        Tensor::empty(in.type.shape, in.type.dtype, exec_->device());
  }
}

CompiledStep::~CompiledStep() = default;

const CompiledStep::Mode* CompiledStep::find_mode(const std::vector<ValueId>& fetches, bool update,
                                                  bool training) const {
  auto it = modes_.find(ModeKey{fetches, update, training});
  return it == modes_.end() ? nullptr : it->second.get();
}

CompiledStep::Mode& CompiledStep::mode(const std::vector<ValueId>& fetches, bool update,
                                       bool training) {
  std::unique_ptr<Mode>& slot = modes_[ModeKey{fetches, update, training}];
  if (slot) return *slot;
  std::vector<ValueId> resolved;
  for (ValueId v : fetches) {
    QG_CHECK(v >= 0 && v < graph_.num_values(), "compile", "fetch of value ", v, ", the graph has ",
             graph_.num_values(), " values");
    auto it = outputs_.find(v);
    if (it != outputs_.end()) v = it->second;
    resolved.push_back(v);
    const Node& producer = graph_.node(graph_.value(v).producer);
    QG_CHECK(!producer.dead, "compile", "value ", v, " ('", graph_.value(v).name,
             "') was fused away by a pass; list it in CompileOptions::outputs to fetch it");
  }
  auto m = std::make_unique<Mode>();
  m->fetches = resolved;
  if (update) m->targets = updates_;
  m->training = training;
  std::vector<bool> needed = graph_.needed_nodes(m->fetches, m->targets);
  for (NodeId id = 0; id < graph_.num_nodes(); ++id)
    if (needed[id] && graph_.node(id).op->name == "input")
      m->needed_inputs.push_back(graph_.node(id).name);
  slot = std::move(m);
  return *slot;
}

void CompiledStep::write_feeds(const Mode& m, const Executor::Feeds& feeds) {
  // Everything is checked before any byte is written, so a bad feed changes nothing.
  for (const std::string& name : m.needed_inputs)
    QG_CHECK(feeds.count(name) != 0 || fed_.count(name) != 0, "compile", "graph input '", name,
             "' was not fed (this run needs it)");
  for (const auto& [name, value] : feeds) {
    auto it = inputs_.find(name);
    QG_CHECK(it != inputs_.end(), "compile", "feed '", name, "' does not name a graph input");
    const Tensor& dst = it->second;
    QG_CHECK(value.defined(), "compile", "graph input '", name, "' was fed an undefined tensor");
    QG_CHECK(value.dtype() == dst.dtype() && value.shape() == dst.shape(), "compile",
             "graph input '", name, "' is ", dst.str(), ", fed ", value.str(),
             " (shapes are fixed when the graph is built: compile one step per shape)");
  }
  for (const auto& [name, value] : feeds) {
    Tensor& dst = inputs_.at(name);
    Tensor src = value.is_contiguous() ? value : value.to(value.device());
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
    fed_.insert(name);
  }
}

const std::vector<Tensor>& CompiledStep::run(Mode& m, const Executor::Feeds& feeds) {
  write_feeds(m, feeds);
  exec_->set_training(m.training);
  Executor::Feeds bound;
  for (const std::string& name : m.needed_inputs) bound[name] = inputs_.at(name);
  // 5. The first call runs through the executor, which validates every node and creates
  //    the states; it is a step like any other.
  if (m.calls == 0) {
    m.results = exec_->run(bound, m.fetches, m.targets);
    m.path = RunPath::executor;
    m.calls = 1;  // only once it succeeded: a failed first run is retried as a first run
    return m.results;
  }
  ++m.calls;
  if (!m.run)
    m.run = std::make_unique<StaticRun>(*exec_, bound, m.fetches, m.targets, options_.plan_memory,
                                        /*validate=*/false);
  // The first launch records the kernels' temporaries and one-time set-up, which a capture
  // must not contain; every later call replays the capture.
  const bool replay = !exec_->device().is_cpu() && options_.cuda_graph && m.calls > 2;
  if (replay) {
    if (!m.run->captured()) m.run->capture();
    m.run->replay();
    m.path = RunPath::replay;
  } else {
    m.run->launch();
    m.path = RunPath::launch;
  }
  m.results.clear();
  for (ValueId v : m.fetches) m.results.push_back(m.run->value(v));
  return m.results;
}

const std::vector<Tensor>& CompiledStep::train(const Executor::Feeds& feeds,
                                               const std::vector<ValueId>& fetches) {
  QG_CHECK(!updates_.empty(), "compile", "train() on a step compiled without a loss");
  return run(mode(fetches, true, true), feeds);
}

const std::vector<Tensor>& CompiledStep::forward(const Executor::Feeds& feeds,
                                                 const std::vector<ValueId>& fetches,
                                                 bool training) {
  return run(mode(fetches, false, training), feeds);
}

void CompiledStep::synchronize() {
  for (auto& [key, m] : modes_)
    if (m->run) {
      m->run->synchronize();
      return;  // one device-wide check covers every mode
    }
}

RunPath CompiledStep::last_path(const std::vector<ValueId>& fetches, bool update,
                                bool training) const {
  const Mode* m = find_mode(fetches, update, training);
  QG_CHECK(m != nullptr, "compile", "no run of this mode yet");
  return m->path;
}

int CompiledStep::kernels_per_launch(const std::vector<ValueId>& fetches, bool update,
                                     bool training) const {
  const Mode* m = find_mode(fetches, update, training);
  return m && m->run ? m->run->kernels_per_launch() : 0;
}

int64_t CompiledStep::arena_bytes(const std::vector<ValueId>& fetches, bool update,
                                  bool training) const {
  const Mode* m = find_mode(fetches, update, training);
  return m && m->run ? m->run->plan().arena_bytes : 0;
}

int64_t CompiledStep::planned_arena_bytes(const std::vector<ValueId>& fetches, bool update,
                                          bool training) {
  const Mode& m = mode(fetches, update, training);
  return plan_memory(graph_, needed_order(graph_, m.fetches, m.targets), m.fetches).arena_bytes;
}

namespace {

// "<node>/<state>" for each state of `n`, in order: a fused node's states are those of the
// nodes it took in, concatenated (recursively, for fusions of fused nodes).
void collect_state_keys(const Node& n, std::vector<std::string>& keys) {
  if (n.fused_from.empty()) {
    for (const StateSpec& s : n.states) keys.push_back(n.name + "/" + s.name);
    return;
  }
  const size_t before = keys.size();
  for (const Node& original : n.fused_from) collect_state_keys(original, keys);
  QG_CHECK(keys.size() - before == n.states.size(), "compile", "fused node '", n.name, "' has ",
           n.states.size(), " states but the nodes it took in have ", keys.size() - before);
}

}  // namespace

std::map<std::string, Tensor*> state_index(Executor& exec) {
  const Graph& g = exec.graph();
  std::map<std::string, Tensor*> index;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.dead || n.states.empty() || n.op->name == "constant") continue;
    std::vector<std::string> keys;
    collect_state_keys(n, keys);
    std::vector<Tensor>& states = exec.mutable_states(id);
    for (size_t i = 0; i < keys.size(); ++i) {
      QG_CHECK(index.emplace(keys[i], &states.at(i)).second, "compile", "two states are keyed '",
               keys[i], "' (node names must be unique among stateful nodes)");
    }
  }
  return index;
}

void share_states(Executor& from, Executor& to) {
  std::map<std::string, Tensor*> source = state_index(from);
  std::map<std::string, Tensor*> target = state_index(to);
  // Checked in full before anything changes, so a mismatch leaves `to` as it was.
  for (const auto& [key, dst] : target) {
    auto it = source.find(key);
    QG_CHECK(it != source.end(), "compile", "state '", key, "' has no counterpart to share");
    QG_CHECK(it->second->dtype() == dst->dtype() && it->second->shape() == dst->shape(), "compile",
             "state '", key, "' is ", dst->str(), " here but ", it->second->str(),
             " in the program it is shared with");
  }
  for (auto& [key, dst] : target) *dst = *source.at(key);
}

}  // namespace qg
