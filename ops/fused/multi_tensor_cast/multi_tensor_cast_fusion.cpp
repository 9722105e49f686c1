// The fuse_multi_tensor_cast rule: every cast of a parameter to one narrower dtype (the bf16
// compute copies of a mixed-precision step's f32 weights) becomes one fused_multi_tensor_cast
// node, its outputs in the casts' places.
//
//   param_0 ─► cast ─► w16_0        param_0, param_1, ... ─► fused_multi_tensor_cast
//   param_1 ─► cast ─► w16_1                                   ─► w16_0, w16_1, ...
//
// A group shares the source dtype (f32) and the destination dtype (bf16 or f16), and holds
// two casts at least. A cast's control dependencies (the optimizer's update of its parameter
// runs after every reader of it) move to the fused node, which reads every parameter of the
// group. Legal only when no cast of the group has a graph input other than a parameter's
// value (so the fused node can run first, before anything the casts' readers compute).
#include <algorithm>

#include "core/graph.h"
#include "core/graph_rewrite.h"
#include "ops/fused/multi_tensor_cast/multi_tensor_cast.h"

namespace qg {
namespace {

// Whether `n` casts a parameter's value to bf16 or f16 from f32.
bool is_weight_cast(const Graph& g, const Node& n) {
  if (n.dead || n.op->name != "cast" || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  const Value& x = g.value(n.inputs[0]);
  if (x.producer < 0 || g.node(x.producer).op->name != "parameter") return false;
  const DType to = g.value(n.outputs[0]).type.dtype;
  return x.type.dtype == DType::f32 && (to == DType::bf16 || to == DType::f16);
}

DType target(const Graph& g, const Node& n) {
  return g.value(n.outputs[0]).type.dtype;
}

// 1. Match: at the group's first cast (lowest id), the whole group.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& first = g.node(id);
  if (!is_weight_cast(g, first)) return {};
  FusionCandidate c;
  for (NodeId k = 0; k < g.num_nodes(); ++k) {
    const Node& n = g.node(k);
    if (!is_weight_cast(g, n) || target(g, n) != target(g, first)) continue;
    if (k < id) return {};  // not the group's first cast
    c.nodes.push_back(k);
  }
  if (c.nodes.size() < 2) return {};
  return {c};
}

// 3. Build: one node in place of the group; each cast's orderings moved to it.
void build(Graph& g, const FusionCandidate& c) {
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_multi_tensor_cast");
  fused.name = "multi_tensor_cast." + g.node(c.nodes.front()).name + "+" +
               std::to_string(c.nodes.size() - 1);
  std::vector<ValueId> replaced;
  std::vector<ControlEdges> moved;
  for (NodeId k : c.nodes) {
    const Node& n = g.node(k);
    fused.inputs.push_back(n.inputs[0]);
    fused.fused_from.push_back(n);
    replaced.push_back(n.outputs[0]);
    moved.push_back(control_edges(g, k));
  }
  const NodeId id = replace_with_fused_node(g, std::move(fused), replaced, c.nodes);
  for (const ControlEdges& e : moved) add_control_edges(g, e, id);
}

}  // namespace

// 2. Legal.
std::string multi_tensor_cast_blocker(const Graph& g, const std::vector<NodeId>& casts) {
  if (casts.size() < 2) return "fewer than two casts";
  for (NodeId k : casts)
    if (!is_weight_cast(g, g.node(k)))
      return "node '" + g.node(k).name + "' is not an f32 parameter's cast to bf16 or f16";
  for (NodeId k : casts)
    for (NodeId b : control_edges(g, k).before)
      return "cast '" + g.node(k).name + "' is ordered after node '" + g.node(b).name + "'";
  return "";
}

FusionRule multi_tensor_cast_fusion_rule() {
  return {"fuse_multi_tensor_cast", match,
          [](const Graph& g, const FusionCandidate& c) {
            return multi_tensor_cast_blocker(g, c.nodes);
          },
          build};
}

}  // namespace qg
