// The fuse_cast_ste rule.
//
//   before:                                                 after:
//     dw16 (bf16) ─► cast (f32) ─► dw ─► ste_backward ─► dx     dw16, mask ─► fused_cast_ste ─► dx
//                                        mask ─┘
//
// Legal when: the cast widens bf16 or f16 to f32; its output is the ste_backward's dy, read by
// the ste_backward alone, and is not a graph output or named (fusion removes it); and neither
// node has a control dependency (a removed node would drop the ordering it carries). Runs after
// the rules that fuse an ste_backward with its reader (fuse_ste_optimizer, fuse_ste_chain, ...):
// those save more, and take the ste_backward nodes first.
#include "core/graph_rewrite.h"
#include "ops/fused/cast_ste/cast_ste.h"
#include "ops/fused/common/control_edges.h"

namespace qg {
namespace {

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& ste = g.node(id);
  if (ste.op->name != "ste_backward" || ste.inputs.size() != 2) return {};
  const NodeId cast = g.value(ste.inputs[0]).producer;
  if (cast < 0 || g.node(cast).op->name != "cast") return {};
  return {{{cast, id}}};
}

void build(Graph& g, const FusionCandidate& c) {
  const Node cast = g.node(c.nodes[0]);
  const Node ste = g.node(c.nodes[1]);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_cast_ste");
  fused.name = ste.name + "+" + cast.name;
  fused.inputs = {cast.inputs[0], ste.inputs[1]};
  fused.fused_from = {cast, ste};
  replace_with_fused_node(g, std::move(fused), {ste.outputs[0]}, {c.nodes[1], c.nodes[0]});
}

}  // namespace

std::string cast_ste_fusion_blocker(const Graph& g, NodeId ste_id) {
  const Node& ste = g.node(ste_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  const ValueId dy = ste.inputs.at(0);
  const NodeId cast_id = g.value(dy).producer;
  if (cast_id < 0 || g.node(cast_id).op->name != "cast") return "dy is not a cast's output";
  const DType from = g.value(g.node(cast_id).inputs.at(0)).type.dtype;
  if (g.value(dy).type.dtype != DType::f32 || (from != DType::bf16 && from != DType::f16))
    return "the cast does not widen bf16 or f16 to f32";
  if (ste.inputs.at(1) == dy) return "the mask is dy";
  if (g.is_output(dy)) return "dy is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(dy);
  if (readers.size() != 1 || readers[0] != ste_id) return "dy has another reader";
  if (has_control_edges(g, cast_id)) return "the cast has a control dependency";
  if (has_control_edges(g, ste_id)) return "the ste_backward has a control dependency";
  return "";
}

FusionRule cast_ste_fusion_rule() {
  return {"fuse_cast_ste", match,
          [](const Graph& g, const FusionCandidate& c) {
            return cast_ste_fusion_blocker(g, c.nodes[1]);
          },
          build};
}

}  // namespace qg
