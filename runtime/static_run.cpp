#include "runtime/static_run.h"

#include "core/error.h"

namespace qg {

StaticRun::StaticRun(Executor& exec, const Executor::Feeds& feeds,
                     const std::vector<ValueId>& fetches)
    : exec_(exec) {
  const Graph& g = exec.graph();
  // One validated run through the executor: it checks every type, creates the states, and
  // leaves every value's final tensor behind (run_all keeps them all).
  std::vector<Tensor> all = exec.run_all(feeds);
  values_ = all;
  std::vector<bool> needed(g.num_nodes(), false);
  std::vector<NodeId> stack;
  for (ValueId v : fetches) stack.push_back(g.value(v).producer);
  const BoostGraph& bg = g.boost_graph();
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (needed[id]) continue;
    needed[id] = true;
    for (auto [e, end] = boost::in_edges(id, bg); e != end; ++e)
      stack.push_back(static_cast<NodeId>(boost::source(*e, bg)));
  }
  for (NodeId id : g.topological_order()) {
    const Node& n = g.node(id);
    if (!needed[id]) continue;
    if (n.op->name == "input") {
      input_ids_[n.name] = n.outputs[0];
      continue;
    }
    if (n.op->is_source) continue;  // constants and parameters: their state tensor, bound above
    DType key = g.value(n.inputs.empty() ? n.outputs[0] : n.inputs[0]).type.dtype;
    const KernelDef* k = n.op->find_kernel(exec.device().type, key);
    QG_CHECK(k != nullptr, n.op->name, "no kernel for ", exec.device().str());
    steps_.push_back({id, k});
  }
}

void StaticRun::bind_input(const std::string& name, const Tensor& value) {
  auto it = input_ids_.find(name);
  QG_CHECK(it != input_ids_.end(), "static_run", "no graph input named '", name, "'");
  const Tensor& old = values_[it->second];
  QG_CHECK(value.dtype() == old.dtype() && value.shape() == old.shape() &&
               value.device() == old.device(),
           "static_run", "input '", name, "' is ", old.str(), ", got ", value.str());
  values_[it->second] = value;
}

void StaticRun::launch() {
  const Graph& g = exec_.graph();
  for (const Step& s : steps_) {
    const Node& n = g.node(s.node);
    std::vector<Tensor> inputs, outputs;
    for (ValueId in : n.inputs) inputs.push_back(values_[in]);
    for (ValueId out : n.outputs) outputs.push_back(values_[out]);
    std::vector<Tensor>& states = const_cast<std::vector<Tensor>&>(exec_.states(s.node));
    KernelContext ctx{
        n.op->name,       n,       n.attrs, std::move(inputs), std::move(outputs), states,
        exec_.training(), nullptr, nullptr};
    ctx.stream = exec_.stream();
    s.kernel->fn(ctx);
    for (size_t i = 0; i < n.outputs.size(); ++i) values_[n.outputs[i]] = ctx.outputs[i];
  }
}

}  // namespace qg
