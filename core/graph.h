// The computation graph: nodes are op instances, edges are values. Nodes live as bundled
// vertex properties of a Boost.Graph adjacency_list; an edge runs from a value's producer
// to each consumer (and for explicit control dependencies). Ordering uses Boost's
// topological sort, so a cycle is reported instead of silently mis-scheduled.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

struct Value {
  ValueId id = kNoValue;
  NodeId producer = -1;
  int index = 0;  // which output of the producer
  TensorType type;
  std::string name;
};

struct Node {
  NodeId id = -1;
  const OpDef* op = nullptr;
  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;   // resolved: defaults filled in, validated
  Tensor value;  // constants and parameter initial values
  std::vector<StateSpec> states;
  bool dead = false;  // removed by a pass; kept so ids stay stable
  // For nodes made by a fusion pass: the original nodes, in execution order. Fused kernels
  // read their attributes, and the fused node's states are theirs, concatenated.
  std::vector<Node> fused_from;
};

struct EdgeInfo {
  ValueId value = kNoValue;  // kNoValue for a control dependency
  int slot = -1;
};

using BoostGraph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Node, EdgeInfo>;

class Graph {
 public:
  // Op names resolve in `registry`. The default, the process-wide registry filled from the
  // op table, is looked up here in the header: the table belongs to the ops layer above
  // core, which the code that builds graphs links (core itself does not).
  Graph() : Graph(OpRegistry::instance()) {}
  explicit Graph(const OpRegistry& registry) : registry_(&registry) {}

  // Graph inputs are fed by name at run time.
  ValueId input(const std::string& name, TensorType type);
  ValueId constant(const Tensor& value, const std::string& name = "");
  // A trainable tensor kept as persistent state by the executor.
  ValueId parameter(const std::string& name, const Tensor& init);
  // A persistent state tensor that is not trained (not in parameters()): the caller writes
  // it between runs through Executor::state(node, "value"), and every run reads the value
  // on the device (the optimizer's learning rate).
  ValueId variable(const std::string& name, const Tensor& init);

  // Appends one node. Validates the op, arity, attributes and input types, and infers the
  // output types; throws qg::Error naming the op on any problem.
  std::vector<ValueId> apply(const std::string& op, const std::vector<ValueId>& inputs,
                             const Attrs& attrs = {}, const std::string& name = "");
  ValueId apply1(const std::string& op, const std::vector<ValueId>& inputs, const Attrs& attrs = {},
                 const std::string& name = "");

  const Value& value(ValueId id) const;
  const Node& node(NodeId id) const;
  // The dtypes of a node's inputs, in order: the key its kernel is looked up by.
  std::vector<DType> input_dtypes(const Node& node) const;
  std::vector<TensorType> input_types(const Node& node) const;
  // The node's kernel arguments, parsed once (for a fused node, its original nodes' too).
  std::shared_ptr<const PreparedArgs> prepare_args(const Node& node) const;
  int num_nodes() const { return static_cast<int>(boost::num_vertices(g_)); }
  int num_values() const { return static_cast<int>(values_.size()); }
  int num_live_nodes() const;

  void set_name(ValueId id, const std::string& name);
  // Graph outputs may be fetched, so passes never fuse them away. Named values count as
  // outputs too: a user who names a value may fetch it by that name.
  void mark_output(ValueId id);
  bool is_output(ValueId id) const;
  ValueId find(const std::string& name) const;  // kNoValue when absent
  ValueId at(const std::string& name) const;    // throws when absent
  std::vector<ValueId> inputs() const;          // values produced by `input` nodes
  std::vector<NodeId> parameters() const;
  std::vector<NodeId> consumers(ValueId id) const;
  // The nodes that producing `fetches` and running `targets` requires (their ancestors
  // through data and control edges), as a per-node flag.
  std::vector<bool> needed_nodes(const std::vector<ValueId>& fetches,
                                 const std::vector<NodeId>& targets = {}) const;

  // Passes: rewire an input, order two nodes, or remove a node no live node reads.
  void replace_input(NodeId node, int slot, ValueId value);
  void add_control_dependency(NodeId before, NodeId after);
  void remove_node(NodeId node);
  // Appends a node without shape inference (fused nodes built by passes).
  NodeId add_raw_node(Node node, const std::vector<TensorType>& output_types);
  // Replaces node `id` by `node` (a fused node built by a pass) while keeping its id, its
  // outputs and its control dependencies: for a fusion into a node that callers hold by id,
  // such as an optimizer step run as an Executor target. The data edges follow node.inputs.
  void rewrite_node(NodeId id, Node node);

  // Throws on a dangling input (a value that is not defined or whose producer was
  // removed), an input used before it is defined in the order, or a cycle.
  std::vector<NodeId> topological_order() const;
  void validate() const;

  const BoostGraph& boost_graph() const { return g_; }
  std::string dump() const;

 private:
  // topological_order's reordering around asynchronous nodes (graph.cpp).
  std::vector<NodeId> overlap_async_nodes(std::vector<NodeId> order) const;
  ValueId state_source(const std::string& op, const std::string& name, const Tensor& init);
  NodeId add_node(Node node, const std::vector<TensorType>& output_types);
  void check_value(ValueId id, const std::string& op, const std::string& what) const;

  const OpRegistry* registry_;
  BoostGraph g_;
  std::vector<Value> values_;
  std::map<std::string, ValueId> names_;
  std::vector<bool> marked_outputs_;
};

}  // namespace qg
