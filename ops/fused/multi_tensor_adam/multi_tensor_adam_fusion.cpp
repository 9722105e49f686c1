// The fuse_multi_tensor_adam rule: every adam step of a graph that shares its hyper-parameters
// and its parameter and gradient dtypes becomes one fused_multi_tensor_adam node, as
// fuse_multi_tensor_adamw does for adamw (multi_tensor_adamw_fusion.cpp): the first step is
// rewritten in place (it keeps its id, which callers hold as a run target), and the others'
// control dependencies move to it. Legal only when no step of the group is an ancestor of
// another's inputs, which the merged node would turn into a cycle.
#include <algorithm>
#include <tuple>

#include "core/graph.h"
#include "core/graph_rewrite.h"
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"

namespace qg {
namespace {

using GroupKey = std::tuple<DType, DType, double, double, double, double, double>;

GroupKey key_of(const Graph& g, const Node& n) {
  const Attrs& a = n.attrs;
  return {g.value(n.inputs.at(0)).type.dtype,
          g.value(n.inputs.at(1)).type.dtype,
          a.get_real("lr"),
          a.get_real("beta1"),
          a.get_real("beta2"),
          a.get_real("eps"),
          a.get_real("weight_decay")};
}

bool is_adam(const Node& n) {
  return !n.dead && n.op->name == "adam" && n.inputs.size() == 2;
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& first = g.node(id);
  if (!is_adam(first)) return {};
  const GroupKey key = key_of(g, first);
  FusionCandidate c;
  for (NodeId k = 0; k < g.num_nodes(); ++k) {
    const Node& n = g.node(k);
    if (!is_adam(n) || key_of(g, n) != key) continue;
    if (k < id) return {};  // not the group's first step
    c.nodes.push_back(k);
  }
  if (c.nodes.size() < 2) return {};
  return {c};
}

void build(Graph& g, const FusionCandidate& c) {
  const NodeId head = c.nodes.front();
  std::vector<Node> parts;
  for (NodeId k : c.nodes) parts.push_back(g.node(k));
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_multi_tensor_adam");
  fused.name = "multi_tensor_adam." + parts.front().name + "+" + std::to_string(parts.size() - 1);
  for (const Node& p : parts) {
    fused.inputs.push_back(p.inputs.at(0));
    fused.inputs.push_back(p.inputs.at(1));
  }
  fused.attrs = parts.front().attrs;
  for (const Node& p : parts)
    fused.states.insert(fused.states.end(), p.states.begin(), p.states.end());
  fused.fused_from = parts;
  std::vector<ControlEdges> moved;
  for (size_t i = 1; i < c.nodes.size(); ++i) moved.push_back(control_edges(g, c.nodes[i]));
  g.rewrite_node(head, std::move(fused));
  for (size_t i = 1; i < c.nodes.size(); ++i) g.remove_node(c.nodes[i]);
  auto outside = [&](NodeId n) {
    return std::find(c.nodes.begin(), c.nodes.end(), n) == c.nodes.end();
  };
  for (const ControlEdges& e : moved) {
    for (NodeId b : e.before)
      if (outside(b)) g.add_control_dependency(b, head);
    for (NodeId a : e.after)
      if (outside(a)) g.add_control_dependency(head, a);
  }
}

}  // namespace

std::string multi_tensor_adam_blocker(const Graph& g, const std::vector<NodeId>& steps) {
  std::vector<ValueId> inputs;
  for (NodeId k : steps) {
    if (!is_adam(g.node(k))) return "node '" + g.node(k).name + "' is not an adam step";
    for (ValueId v : g.node(k).inputs) inputs.push_back(v);
  }
  const std::vector<bool> ancestors = g.needed_nodes(inputs);
  for (NodeId k : steps)
    if (ancestors[k])
      return "step '" + g.node(k).name + "' comes before an input of another step of its group";
  return "";
}

FusionRule multi_tensor_adam_fusion_rule() {
  return {"fuse_multi_tensor_adam", match,
          [](const Graph& g, const FusionCandidate& c) {
            return multi_tensor_adam_blocker(g, c.nodes);
          },
          build};
}

}  // namespace qg
