#include "core/graph.h"

#include <algorithm>
#include <boost/graph/strong_components.hpp>
#include <boost/graph/topological_sort.hpp>
#include <map>
#include <queue>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace qg {
namespace {

// The declared name of input `slot` of `op`; a variadic op's repeated last input keeps its
// name, and a fused node's extra inputs are numbered.
std::string declared_input_name(const OpDef& op, size_t slot) {
  if (slot < op.inputs.size()) return op.inputs[slot];
  if (op.variadic && !op.inputs.empty()) return op.inputs.back();
  return "input " + std::to_string(slot);
}

}  // namespace

NodeId Graph::add_node(Node node, const std::vector<TensorType>& output_types) {
  auto v = boost::add_vertex(g_);
  node.id = static_cast<NodeId>(v);
  node.outputs.clear();
  for (size_t i = 0; i < output_types.size(); ++i) {
    Value val;
    val.id = static_cast<ValueId>(values_.size());
    val.producer = node.id;
    val.index = static_cast<int>(i);
    val.type = output_types[i];
    node.outputs.push_back(val.id);
    values_.push_back(val);
  }
  for (size_t slot = 0; slot < node.inputs.size(); ++slot) {
    ValueId in = node.inputs[slot];
    boost::add_edge(values_[in].producer, v, EdgeInfo{in, static_cast<int>(slot)}, g_);
  }
  g_[v] = std::move(node);
  return static_cast<NodeId>(v);
}

NodeId Graph::add_raw_node(Node node, const std::vector<TensorType>& output_types) {
  for (ValueId in : node.inputs) check_value(in, node.op ? node.op->name : "graph", "input");
  return add_node(std::move(node), output_types);
}

void Graph::check_value(ValueId id, const std::string& op, const std::string& what) const {
  QG_CHECK(id >= 0 && id < num_values(), op, what, " refers to value ", id,
           ", which is not defined in this graph (it has ", num_values(), " values)");
  QG_CHECK(!g_[values_[id].producer].dead, op, what, " refers to value ", id, " ('",
           values_[id].name, "') whose producer node ", values_[id].producer,
           " was removed: a dangling input");
}

ValueId Graph::input(const std::string& name, TensorType type) {
  QG_CHECK(!name.empty(), "input", "a graph input needs a name");
  QG_CHECK(find(name) == kNoValue, "input", "the name '", name, "' is already used");
  Node n;
  n.op = &registry_->get("input");
  n.name = name;
  n.attrs = resolve_attrs(*n.op, Attrs{{"dtype", dtype_name(type.dtype)}, {"shape", type.shape}});
  NodeId id = add_node(std::move(n), {type});
  ValueId v = g_[id].outputs[0];
  set_name(v, name);
  return v;
}

ValueId Graph::constant(const Tensor& value, const std::string& name) {
  QG_CHECK(value.defined(), "constant", "an undefined tensor cannot be a constant");
  Node n;
  n.op = &registry_->get("constant");
  n.name = name.empty() ? "constant" : name;
  n.value = value.device().is_cpu() ? value.clone() : value.to(Device::cpu());
  TensorType t{value.dtype(), value.shape()};
  n.states = {StateSpec{"value", t, 0.0}};
  NodeId id = add_node(std::move(n), {t});
  ValueId v = g_[id].outputs[0];
  if (!name.empty()) set_name(v, name);
  return v;
}

ValueId Graph::parameter(const std::string& name, const Tensor& init) {
  QG_CHECK(!name.empty(), "parameter", "a parameter needs a name");
  QG_CHECK(init.defined(), "parameter", "parameter '", name, "' has an undefined initial value");
  QG_CHECK(is_floating(init.dtype()), "parameter", "parameter '", name,
           "' must be floating point, got ", dtype_name(init.dtype()));
  return state_source("parameter", name, init);
}

ValueId Graph::variable(const std::string& name, const Tensor& init) {
  return state_source("variable", name, init);
}

// A source node of `op` that holds one state, "value", initialised to `init` (a host copy).
ValueId Graph::state_source(const std::string& op, const std::string& name, const Tensor& init) {
  QG_CHECK(!name.empty(), op, "a ", op, " needs a name");
  QG_CHECK(init.defined(), op, op, " '", name, "' has an undefined initial value");
  QG_CHECK(find(name) == kNoValue, op, "the name '", name, "' is already used");
  Node n;
  n.op = &registry_->get(op);
  n.name = name;
  n.value = init.device().is_cpu() ? init.clone() : init.to(Device::cpu());
  TensorType t{init.dtype(), init.shape()};
  n.states = {StateSpec{"value", t, 0.0}};
  NodeId id = add_node(std::move(n), {t});
  ValueId v = g_[id].outputs[0];
  set_name(v, name);
  return v;
}

std::vector<ValueId> Graph::apply(const std::string& op_name, const std::vector<ValueId>& inputs,
                                  const Attrs& attrs, const std::string& name) {
  const OpDef& op = registry_->get(op_name);
  QG_CHECK(!op.is_source, op_name, "source op '", op_name,
           "' is created with Graph::input/constant/parameter");
  if (op.variadic)
    QG_CHECK(!op.inputs.empty() && inputs.size() >= op.inputs.size(), op_name, "expects ",
             op.inputs.size(), " or more inputs, got ", inputs.size());
  else
    QG_CHECK(inputs.size() == op.inputs.size(), op_name, "expects ", op.inputs.size(),
             " inputs, got ", inputs.size());
  std::vector<TensorType> in_types;
  std::vector<const Tensor*> constants;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_value(inputs[i], op_name, "input '" + declared_input_name(op, i) + "'");
    in_types.push_back(values_[inputs[i]].type);
    const Node& producer = g_[values_[inputs[i]].producer];
    constants.push_back(producer.op->name == "constant" ? &producer.value : nullptr);
  }
  Node n;
  n.op = &op;
  n.name = name.empty() ? op_name : name;
  n.inputs = inputs;
  n.attrs = resolve_attrs(op, attrs);
  InferContext ctx{op.name, in_types, n.attrs, constants};
  std::vector<TensorType> out_types = op.infer(ctx);
  QG_CHECK(out_types.size() == op.outputs.size(), op_name, "shape inference returned ",
           out_types.size(), " outputs for ", op.outputs.size(), " declared");
  if (op.states) n.states = op.states(ctx);
  NodeId id = add_node(std::move(n), out_types);
  return g_[id].outputs;
}

ValueId Graph::apply1(const std::string& op, const std::vector<ValueId>& inputs, const Attrs& attrs,
                      const std::string& name) {
  auto outs = apply(op, inputs, attrs, name);
  return outs.at(0);
}

const Value& Graph::value(ValueId id) const {
  QG_CHECK(id >= 0 && id < num_values(), "graph", "value ", id, " is not defined (graph has ",
           num_values(), " values)");
  return values_[id];
}

const Node& Graph::node(NodeId id) const {
  QG_CHECK(id >= 0 && id < num_nodes(), "graph", "node ", id, " does not exist (graph has ",
           num_nodes(), " nodes)");
  return g_[id];
}

std::vector<TensorType> Graph::input_types(const Node& node) const {
  std::vector<TensorType> types;
  types.reserve(node.inputs.size());
  for (ValueId in : node.inputs) types.push_back(value(in).type);
  return types;
}

std::shared_ptr<const PreparedArgs> Graph::prepare_args(const Node& node) const {
  std::vector<KernelPart> parts;
  for (const Node& original : node.fused_from)
    parts.push_back(KernelPart{original.op, original.attrs, input_types(original),
                               prepare_args(original), original.states.size()});
  return qg::prepare_args(*node.op, node.attrs, input_types(node), std::move(parts));
}

std::vector<DType> Graph::input_dtypes(const Node& node) const {
  std::vector<DType> dtypes;
  dtypes.reserve(node.inputs.size());
  for (ValueId in : node.inputs) dtypes.push_back(value(in).type.dtype);
  return dtypes;
}

int Graph::num_live_nodes() const {
  int n = 0;
  for (int i = 0; i < num_nodes(); ++i) n += g_[i].dead ? 0 : 1;
  return n;
}

void Graph::set_name(ValueId id, const std::string& name) {
  check_value(id, "graph", "set_name");
  auto it = names_.find(name);
  QG_CHECK(it == names_.end() || it->second == id, "graph", "the name '", name,
           "' is already used by value ", it == names_.end() ? -1 : it->second);
  if (!values_[id].name.empty()) names_.erase(values_[id].name);
  values_[id].name = name;
  names_[name] = id;
}

void Graph::mark_output(ValueId id) {
  check_value(id, "graph", "mark_output");
  if (marked_outputs_.size() < values_.size()) marked_outputs_.resize(values_.size(), false);
  marked_outputs_[id] = true;
}

bool Graph::is_output(ValueId id) const {
  bool marked = id < static_cast<ValueId>(marked_outputs_.size()) && marked_outputs_[id];
  return marked || !value(id).name.empty();
}

ValueId Graph::find(const std::string& name) const {
  auto it = names_.find(name);
  return it == names_.end() ? kNoValue : it->second;
}

ValueId Graph::at(const std::string& name) const {
  ValueId v = find(name);
  QG_CHECK(v != kNoValue, "graph", "no value is named '", name, "'");
  return v;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> out;
  for (int i = 0; i < num_nodes(); ++i)
    if (!g_[i].dead && g_[i].op->name == "input") out.push_back(g_[i].outputs[0]);
  return out;
}

std::vector<NodeId> Graph::parameters() const {
  std::vector<NodeId> out;
  for (int i = 0; i < num_nodes(); ++i)
    if (!g_[i].dead && g_[i].op->name == "parameter") out.push_back(i);
  return out;
}

std::vector<NodeId> Graph::consumers(ValueId id) const {
  check_value(id, "graph", "consumers");
  std::vector<NodeId> out;
  for (auto [e, end] = boost::out_edges(values_[id].producer, g_); e != end; ++e) {
    if (g_[*e].value != id) continue;
    NodeId c = static_cast<NodeId>(boost::target(*e, g_));
    if (!g_[c].dead && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::vector<bool> Graph::needed_nodes(const std::vector<ValueId>& fetches,
                                      const std::vector<NodeId>& targets) const {
  std::vector<bool> needed(num_nodes(), false);
  std::vector<NodeId> stack;
  for (ValueId v : fetches) stack.push_back(value(v).producer);
  for (NodeId t : targets) stack.push_back(node(t).id);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (needed[id]) continue;
    needed[id] = true;
    // In-edges include control dependencies, so an optimizer step's predecessors run too.
    for (auto [e, end] = boost::in_edges(id, g_); e != end; ++e)
      stack.push_back(static_cast<NodeId>(boost::source(*e, g_)));
  }
  return needed;
}

void Graph::replace_input(NodeId node_id, int slot, ValueId value) {
  Node& n = g_[node_id];
  QG_CHECK(slot >= 0 && slot < static_cast<int>(n.inputs.size()), n.name, "input slot ", slot,
           " is out of range (node has ", n.inputs.size(), " inputs)");
  QG_CHECK(value >= 0 && value < num_values(), n.name, "replacement value ", value,
           " is not defined in this graph");
  // Drop the old edge for this slot, then add the new one.
  std::vector<BoostGraph::edge_descriptor> old;
  for (auto [e, end] = boost::in_edges(node_id, g_); e != end; ++e)
    if (g_[*e].slot == slot) old.push_back(*e);
  for (auto e : old) boost::remove_edge(e, g_);
  n.inputs[slot] = value;
  boost::add_edge(values_[value].producer, node_id, EdgeInfo{value, slot}, g_);
}

void Graph::add_control_dependency(NodeId before, NodeId after) {
  node(before);
  node(after);
  boost::add_edge(before, after, EdgeInfo{kNoValue, -1}, g_);
}

void Graph::remove_node(NodeId id) {
  Node& n = g_[id];
  for (ValueId out : n.outputs) {
    auto readers = consumers(out);
    QG_CHECK(readers.empty(), n.name, "cannot remove node ", id, ": output ", out,
             " is read by node ", readers.empty() ? -1 : readers[0]);
  }
  boost::clear_vertex(id, g_);
  n.dead = true;
  for (ValueId out : n.outputs)
    if (!values_[out].name.empty()) names_.erase(values_[out].name);
}

void Graph::rewrite_node(NodeId id, Node replacement) {
  QG_CHECK(id >= 0 && id < num_nodes() && !g_[id].dead, "graph", "rewrite_node: node ", id,
           " does not exist or was removed");
  Node& n = g_[id];
  for (size_t s = 0; s < replacement.inputs.size(); ++s)
    check_value(replacement.inputs[s], replacement.name, "rewritten input");
  // Drop the data edges (control dependencies, value kNoValue, stay), then add the new ones.
  std::vector<BoostGraph::edge_descriptor> data;
  for (auto [e, end] = boost::in_edges(id, g_); e != end; ++e)
    if (g_[*e].value != kNoValue) data.push_back(*e);
  for (auto e : data) boost::remove_edge(e, g_);
  replacement.id = id;
  replacement.outputs = n.outputs;
  replacement.dead = false;
  n = std::move(replacement);
  for (size_t s = 0; s < n.inputs.size(); ++s)
    boost::add_edge(values_[n.inputs[s]].producer, id, EdgeInfo{n.inputs[s], static_cast<int>(s)},
                    g_);
}

// With asynchronous nodes (OpDef::overlaps_async, the data-parallel gradient all-reduce), the
// order is re-made by Kahn's algorithm, always taking the ready node of the lowest class and,
// within a class, the earliest in `order`: class 0 the asynchronous nodes themselves (issued as
// soon as their inputs exist), class 2 every node that depends on one of their outputs (it
// would make the stream wait for the collective), class 1 the rest. So the whole backward pass
// is issued before the first wait for a gradient bucket, and the all-reduces overlap it.
// Within class 2, a node that waits only on early collectives comes before one that waits on
// a later one (keyed by the latest collective among its ancestors, in issue order): the last
// gradient buckets (the embedding's, 131 MB at 32k x 1024) are still being reduced when the
// backward ends, and the optimizer steps of the earlier buckets run meanwhile instead of
// queueing behind them. A graph without such nodes keeps Boost's order.
std::vector<NodeId> Graph::overlap_async_nodes(std::vector<NodeId> order) const {
  bool any = false;
  for (NodeId id : order) any = any || g_[id].op->overlaps_async;
  if (!any) return order;
  const BoostGraph& bg = g_;
  const int n = num_nodes();
  std::vector<int> position(n, -1), cls(n, 1), pending(n, 0);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  // Classes, in the order's sweep: a node after an asynchronous one inherits class 2.
  for (NodeId id : order) {
    if (g_[id].op->overlaps_async) cls[id] = 0;
    for (auto [e, end] = boost::out_edges(id, bg); e != end; ++e) {
      const auto t = static_cast<NodeId>(boost::target(*e, bg));
      if (position[t] >= 0 && (cls[id] == 0 || cls[id] == 2) && !g_[t].op->overlaps_async)
        cls[t] = 2;
    }
  }
  // A node whose every reader is an asynchronous node or another such node (a bucket's packing
  // chain, the casts and weight-gradient GEMMs that only feed it) takes class 0 too: taken as
  // soon as it is ready, it makes the collective ready as soon as its last gradient exists.
  // In class 1, Boost's order had left the packing of the first of two buckets behind most of
  // the backward pass (issued at node 88% of 1354, its all-reduce then overlapping nothing).
  std::vector<bool> feeds_async(n, false);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId id = *it;
    if (cls[id] == 2 || g_[id].op->overlaps_async) continue;
    bool any = false, only = true;
    for (auto [e, end] = boost::out_edges(id, bg); e != end; ++e) {
      const auto t = static_cast<NodeId>(boost::target(*e, bg));
      if (position[t] < 0) continue;
      any = true;
      only = only && (g_[t].op->overlaps_async || feeds_async[t]);
    }
    feeds_async[id] = any && only;
    if (feeds_async[id]) cls[id] = 0;
  }
  for (NodeId id : order)
    for (auto [e, end] = boost::in_edges(id, bg); e != end; ++e)
      if (position[boost::source(*e, bg)] >= 0) ++pending[id];
  // wait[id]: for class 2, the issue rank of the latest collective among id's ancestors (set
  // as the collectives are placed, which precedes every reader of theirs).
  std::vector<int> wait(n, -1);
  int issued = 0;
  using Key = std::tuple<int, int, int>;  // (class, wait, position)
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  // Within class 0 the collectives come before the work that feeds them.
  auto push = [&](NodeId id) {
    ready.push({cls[id], cls[id] == 2 ? wait[id] : (feeds_async[id] ? 1 : 0), position[id]});
  };
  for (NodeId id : order)
    if (pending[id] == 0) push(id);
  std::vector<NodeId> out;
  out.reserve(order.size());
  while (!ready.empty()) {
    const NodeId id = order[std::get<2>(ready.top())];
    ready.pop();
    out.push_back(id);
    if (g_[id].op->overlaps_async) wait[id] = issued++;
    for (auto [e, end] = boost::out_edges(id, bg); e != end; ++e) {
      const auto t = static_cast<NodeId>(boost::target(*e, bg));
      if (position[t] < 0) continue;
      if (!g_[t].op->overlaps_async) wait[t] = std::max(wait[t], wait[id]);
      if (--pending[t] == 0) push(t);
    }
  }
  QG_CHECK(out.size() == order.size(), "graph", "the overlap schedule placed ", out.size(), " of ",
           order.size(), " nodes");
  return out;
}

std::vector<NodeId> Graph::topological_order() const {
  // 1. Every live node's inputs must be defined values with live producers.
  for (int i = 0; i < num_nodes(); ++i) {
    const Node& n = g_[i];
    if (n.dead) continue;
    for (size_t s = 0; s < n.inputs.size(); ++s)
      check_value(n.inputs[s], n.name, "input '" + declared_input_name(*n.op, s) + "'");
  }
  // 2. Boost's topological sort; a back edge means a cycle, reported with its members.
  std::vector<BoostGraph::vertex_descriptor> rev;
  try {
    boost::topological_sort(g_, std::back_inserter(rev));
  } catch (const boost::not_a_dag&) {
    std::vector<int> component(boost::num_vertices(g_));
    boost::strong_components(g_, boost::make_iterator_property_map(
                                     component.begin(), boost::get(boost::vertex_index, g_)));
    std::map<int, std::vector<int>> members;
    for (size_t v = 0; v < component.size(); ++v) members[component[v]].push_back(v);
    std::string cycle;
    for (const auto& [c, vs] : members) {
      if (vs.size() < 2) continue;
      for (int v : vs)
        cycle += (cycle.empty() ? "" : " -> ") + g_[v].name + "#" + std::to_string(v);
      break;
    }
    QG_FAIL("graph", "the graph has a cycle through nodes ", cycle);
  }
  std::vector<NodeId> order;
  for (auto it = rev.rbegin(); it != rev.rend(); ++it)
    if (!g_[*it].dead) order.push_back(static_cast<NodeId>(*it));
  order = overlap_async_nodes(std::move(order));
  // 3. Defensive: inputs must be produced earlier in the order.
  std::vector<int> position(num_nodes(), -1);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  for (NodeId id : order)
    for (ValueId in : g_[id].inputs)
      QG_CHECK(position[values_[in].producer] < position[id], g_[id].name, "value ", in,
               " is used before it is defined");
  return order;
}

void Graph::validate() const {
  topological_order();
}

std::string Graph::dump() const {
  std::ostringstream os;
  for (int i = 0; i < num_nodes(); ++i) {
    const Node& n = g_[i];
    if (n.dead) continue;
    os << "#" << i << " " << n.op->name << " '" << n.name << "' (";
    for (size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << "%" << n.inputs[k];
    os << ") -> ";
    for (size_t k = 0; k < n.outputs.size(); ++k)
      os << (k ? ", " : "") << "%" << n.outputs[k] << ":" << values_[n.outputs[k]].type.str();
    if (!n.attrs.items().empty()) os << " {" << n.attrs.str() << "}";
    os << "\n";
  }
  return os.str();
}

// Declared with the backward rules (core/op_schema.h), which live in ops/ and call it: it
// builds graph nodes only, so it belongs to the graph rather than to autograd above ops.
ValueId BackwardContext::grad_or_zeros(int output) const {
  if (output_grads.at(output) != kNoValue) return output_grads[output];
  return graph.apply1("full_like", {node.outputs.at(output)}, {{"value", 0.0}});
}

}  // namespace qg
