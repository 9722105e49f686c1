// The fuse_grad_cast rule.
//
//   before:                                        after:
//     dw16 (bf16) ─► cast (f32) ─► dw ─► adam(w)     dw16 ─► adam(w)
//
// Under a bf16 mixed-precision policy each f32 weight's gradient comes out of a bf16 GEMM and
// is widened to f32 (the backward of the weight's cast) for the optimizer: an f32 copy of
// every gradient written and read back once a step. The step reads the bf16 gradient itself
// and widens it as it reads it (optim_ops.cpp), exactly the cast's values. Legal when: the
// step is adam or sgd of an f32 parameter; its gradient is the output of a cast from bf16 or
// f16, read by the step alone and not a graph output or named (fusion removes it); and the
// cast has no control dependency. The step's own control dependencies (it runs after every
// reader of the parameter) move to the new node. The new node keeps the step's name and
// states, so checkpoints key them as before.
#include "ops/optim/optim_cast_fusion.h"

#include "core/graph_rewrite.h"
#include "ops/fused/common/control_edges.h"

namespace qg {
namespace {

bool is_step(const Node& n) {
  return n.op->name == "adam" || n.op->name == "sgd";
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (!is_step(n) || n.inputs.size() != 2) return {};
  const NodeId cast = g.value(n.inputs[1]).producer;
  if (cast < 0 || g.node(cast).op->name != "cast") return {};
  return {{{cast, id}}};
}

void build(Graph& g, const FusionCandidate& c) {
  const Node cast = g.node(c.nodes[0]);
  const Node step = g.node(c.nodes[1]);
  Node fused = step;
  fused.inputs[1] = cast.inputs[0];
  fused.fused_from = {cast, step};
  const ControlEdges edges = control_edges(g, c.nodes[1]);
  const NodeId id = replace_with_fused_node(g, std::move(fused), {}, {c.nodes[1], c.nodes[0]});
  add_control_edges(g, edges, id);
}

}  // namespace

std::string grad_cast_fusion_blocker(const Graph& g, NodeId step_id) {
  const Node& step = g.node(step_id);
  if (!is_step(step)) return step.op->name + " is not adam or sgd";
  if (g.value(step.inputs.at(0)).type.dtype != DType::f32) return "the parameter is not f32";
  const ValueId grad = step.inputs.at(1);
  const NodeId cast_id = g.value(grad).producer;
  if (cast_id < 0 || g.node(cast_id).op->name != "cast") return "the gradient is not a cast's";
  const DType from = g.value(g.node(cast_id).inputs.at(0)).type.dtype;
  if (from != DType::bf16 && from != DType::f16) return "the cast does not widen bf16 or f16";
  if (g.is_output(grad)) return "the gradient is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(grad);
  if (readers.size() != 1 || readers[0] != step_id) return "the gradient has another reader";
  if (has_control_edges(g, cast_id)) return "the cast has a control dependency";
  return "";
}

FusionRule grad_cast_fusion_rule() {
  return {"fuse_grad_cast", match,
          [](const Graph& g, const FusionCandidate& c) {
            return grad_cast_fusion_blocker(g, c.nodes[1]);
          },
          build};
}

}  // namespace qg
