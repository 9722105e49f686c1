#include "ops/fused/common/step_group.h"

#include <algorithm>

#include "core/graph_rewrite.h"
#include "core/op_registry.h"

namespace qg {

NodeId step_collective(const Graph& g, NodeId id) {
  bool any = false;
  for (NodeId k = 0; k < g.num_nodes() && !any; ++k)
    any = !g.node(k).dead && g.node(k).op->overlaps_async;
  if (!any) return -1;  // one process: no walk over the ancestors
  const std::vector<bool> ancestors = g.needed_nodes({g.node(id).inputs.at(1)});
  NodeId latest = -1;
  for (NodeId k = 0; k < g.num_nodes(); ++k)
    if (ancestors[k] && !g.node(k).dead && g.node(k).op->overlaps_async) latest = k;
  return latest;
}

std::string step_group_blocker(const Graph& g, const std::vector<NodeId>& steps,
                               const std::string& op) {
  std::vector<ValueId> inputs;
  for (NodeId k : steps) {
    const Node& n = g.node(k);
    if (n.dead || n.op->name != op) return "node '" + n.name + "' is not a live " + op + " step";
    for (ValueId v : n.inputs) inputs.push_back(v);
  }
  const std::vector<bool> ancestors = g.needed_nodes(inputs);
  for (NodeId k : steps)
    if (ancestors[k])
      return "step '" + g.node(k).name + "' comes before an input of another step of its group";
  return "";
}

Node step_group_node(const Graph& g, const std::vector<NodeId>& steps, const std::string& fused_op,
                     const std::string& prefix) {
  Node fused;
  fused.op = &OpRegistry::instance().get(fused_op);
  fused.name = prefix + "." + g.node(steps.front()).name + "+" + std::to_string(steps.size() - 1);
  for (NodeId k : steps) {
    const Node& p = g.node(k);
    fused.inputs.push_back(p.inputs.at(0));
    fused.inputs.push_back(p.inputs.at(1));
    fused.states.insert(fused.states.end(), p.states.begin(), p.states.end());
    fused.fused_from.push_back(p);
  }
  fused.attrs = g.node(steps.front()).attrs;
  return fused;
}

void merge_step_group(Graph& g, const std::vector<NodeId>& steps, Node fused) {
  const NodeId head = steps.front();
  std::vector<ControlEdges> moved;
  for (size_t i = 1; i < steps.size(); ++i) moved.push_back(control_edges(g, steps[i]));
  g.rewrite_node(head, std::move(fused));
  for (size_t i = 1; i < steps.size(); ++i) g.remove_node(steps[i]);
  auto outside = [&](NodeId n) { return std::find(steps.begin(), steps.end(), n) == steps.end(); };
  for (const ControlEdges& e : moved) {
    for (NodeId b : e.before)
      if (outside(b)) g.add_control_dependency(b, head);
    for (NodeId a : e.after)
      if (outside(a)) g.add_control_dependency(head, a);
  }
}

}  // namespace qg
