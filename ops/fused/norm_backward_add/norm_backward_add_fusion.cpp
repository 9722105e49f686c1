// The fuse_norm_backward_add rule.
//
//   before:                                             after:
//     rms_norm_backward(dy, x, w, rstd) ─► dx, dw         fused_rms_norm_backward_add(dy, x, w,
//     add(residual, dx) ─► y ─► ...                         rstd, residual) ─► y, dw
//     [y ─► cast (bf16) ─► y16 ─► ...]                     [_cast: ─► y, dw, y16]
//
// Legal when: dx is read by the add alone, as its second operand (autograd accumulates a new
// gradient onto the running one: add(running, new)), and is not a graph output or named; the
// add does not broadcast (residual and dx have one type); and the add has no control
// dependency. The rms_norm_backward's control dependencies (the optimizer's update of the
// norm weight runs after every reader of it) move to the fused node, which reads the same
// weight. One reader of y that is a cast narrowing an f32 y to bf16/f16, with no control
// dependency, joins the fused node (y keeps its other readers).
#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/common/control_edges.h"
#include "ops/fused/norm_backward_add/norm_backward_add.h"

namespace qg {
namespace {

// The narrowing cast of y that joins, or -1.
NodeId narrowing_cast(const Graph& g, ValueId y) {
  for (NodeId r : g.consumers(y)) {
    const Node& n = g.node(r);
    if (n.op->name != "cast" || n.inputs.size() != 1 || has_control_edges(g, r)) continue;
    const DType to = g.value(n.outputs.at(0)).type.dtype;
    if (g.value(y).type.dtype == DType::f32 && (to == DType::bf16 || to == DType::f16)) return r;
  }
  return -1;
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "rms_norm_backward" || n.outputs.size() != 2) return {};
  const std::vector<NodeId> readers = g.consumers(n.outputs[0]);
  if (readers.size() != 1) return {};
  FusionCandidate c;
  c.nodes = {id, readers[0], narrowing_cast(g, g.node(readers[0]).outputs.at(0))};
  return {c};
}

void build(Graph& g, const FusionCandidate& c) {
  const Node norm = g.node(c.nodes[0]);
  const Node add = g.node(c.nodes[1]);
  const bool cast = c.nodes[2] >= 0;
  Node fused;
  fused.op = &OpRegistry::instance().get(cast ? "fused_rms_norm_backward_add_cast"
                                              : "fused_rms_norm_backward_add");
  fused.name = norm.name + "+" + add.name;
  fused.inputs = norm.inputs;
  fused.inputs.push_back(add.inputs[0]);
  fused.fused_from = {norm, add};
  std::vector<ValueId> replaced = {add.outputs[0], norm.outputs[1]};
  std::vector<NodeId> originals = {c.nodes[1], c.nodes[0]};
  if (cast) {
    const Node cast_node = g.node(c.nodes[2]);
    fused.fused_from.push_back(cast_node);
    replaced.push_back(cast_node.outputs[0]);
    originals.insert(originals.begin(), c.nodes[2]);
  }
  const ControlEdges edges = control_edges(g, c.nodes[0]);
  const NodeId id = replace_with_fused_node(g, std::move(fused), replaced, originals);
  add_control_edges(g, edges, id);
}

}  // namespace

std::string norm_backward_add_fusion_blocker(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "rms_norm_backward") return n.op->name + " is not rms_norm_backward";
  const ValueId dx = n.outputs.at(0);
  if (g.is_output(dx)) return "dx is a graph output or named (a run may fetch it)";
  const std::vector<NodeId> readers = g.consumers(dx);
  if (readers.size() != 1) return "dx has another reader";
  const Node& add = g.node(readers[0]);
  if (add.op->name != "add" || add.inputs.size() != 2) return "dx is not read by an add";
  if (add.inputs[1] != dx || add.inputs[0] == dx)
    return "the add does not read dx as its second operand only";
  if (!(g.value(add.inputs[0]).type == g.value(dx).type) ||
      !(g.value(add.outputs.at(0)).type == g.value(dx).type))
    return "the add broadcasts or changes the type (" + g.value(add.inputs[0]).type.str() + " + " +
           g.value(dx).type.str() + ")";
  if (has_control_edges(g, readers[0])) return "the add has a control dependency";
  return "";
}

FusionRule norm_backward_add_fusion_rule() {
  return {"fuse_norm_backward_add", match,
          [](const Graph& g, const FusionCandidate& c) {
            return norm_backward_add_fusion_blocker(g, c.nodes[0]);
          },
          build};
}

}  // namespace qg
