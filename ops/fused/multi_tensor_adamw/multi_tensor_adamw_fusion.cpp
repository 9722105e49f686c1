// The fuse_multi_tensor_adamw rule: every adamw step of a graph that shares its rate input, its
// grad_scale input, its hyper-parameters and its parameter dtype becomes one
// fused_multi_tensor_adamw node.
//
//   adamw(p0, g0, lr, s)   adamw(p1, g1, lr, s)   ...     fused_multi_tensor_adamw(p0, g0, p1,
//                                                          g1, ..., lr, s)
//
// The first step (the lowest node id) is rewritten in place (Graph::rewrite_node): it keeps
// its id, which callers hold as a run target (live_node() maps the others' ids to it), and
// its control dependencies. The others' control dependencies, which order each in-place
// update after every reader of the old parameter (nn::add_optimizer) and before whatever
// reads the updated one (ZeRO's gather), move to the fused node. Legal only when no step of
// the group is an ancestor of another's inputs, which the merged node would turn into a cycle.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/graph.h"
#include "core/graph_rewrite.h"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"

namespace qg {
namespace {

// What the steps of one group share: the rate and scale values, the parameter dtype, the
// hyper-parameters.
using GroupKey = std::tuple<ValueId, ValueId, DType, double, double, double, double, bool>;

GroupKey key_of(const Graph& g, const Node& n) {
  const Attrs& a = n.attrs;
  return {n.inputs.at(2),
          n.inputs.at(3),
          g.value(n.inputs.at(0)).type.dtype,
          a.get_real("beta1"),
          a.get_real("beta2"),
          a.get_real("eps"),
          a.get_real("weight_decay"),
          a.get_bool("decoupled")};
}

bool is_adamw(const Node& n) {
  return !n.dead && n.op->name == "adamw";
}

// 1. Match: at the group's first step, the whole group (two steps at least), by node id.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& first = g.node(id);
  if (!is_adamw(first)) return {};
  const GroupKey key = key_of(g, first);
  FusionCandidate c;
  for (NodeId k = 0; k < g.num_nodes(); ++k) {
    const Node& n = g.node(k);
    if (!is_adamw(n) || key_of(g, n) != key) continue;
    if (k < id) return {};  // not the group's first step
    c.nodes.push_back(k);
  }
  if (c.nodes.size() < 2) return {};
  return {c};
}

// 2. Legal: no step of the group among the ancestors of the group's inputs.
std::string blocker(const Graph& g, const FusionCandidate& c) {
  std::vector<ValueId> inputs;
  for (NodeId k : c.nodes) {
    if (!is_adamw(g.node(k))) return "a step of the group is gone";
    for (ValueId v : g.node(k).inputs) inputs.push_back(v);
  }
  const std::vector<bool> ancestors = g.needed_nodes(inputs);
  for (NodeId k : c.nodes)
    if (ancestors[k])
      return "step '" + g.node(k).name + "' comes before an input of another step of its group";
  return "";
}

// 3. Build: the first step rewritten into the fused node; the others' orderings moved to it.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId head = c.nodes.front();
  std::vector<Node> parts;
  for (NodeId k : c.nodes) parts.push_back(g.node(k));
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_multi_tensor_adamw");
  fused.name = "multi_tensor_adamw." + parts.front().name + "+" + std::to_string(parts.size() - 1);
  for (const Node& p : parts) {
    fused.inputs.push_back(p.inputs.at(0));
    fused.inputs.push_back(p.inputs.at(1));
  }
  fused.inputs.push_back(parts.front().inputs.at(2));
  fused.inputs.push_back(parts.front().inputs.at(3));
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

FusionRule multi_tensor_adamw_fusion_rule() {
  return {"fuse_multi_tensor_adamw", match, blocker, build};
}

}  // namespace qg
