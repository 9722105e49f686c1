// Straight-through estimator pair fusion: the fuse_ste_chain rule.
//
//   before:
//     dy ──► ste_backward ──► t ──► ste_backward ──► dx
//     mask_first ──┘                mask_second ──┘
//   after:
//     dy ──────────┐
//     mask_first ──┼─► fused_ste_chain ──► dx
//     mask_second ─┘
//
// A value quantized twice (a quantized residual sum feeding the block's output quantizer)
// masks its gradient twice. Legal only when t has exactly one reader, the second
// ste_backward reading it as its dy, and t is neither a graph output nor named. Pairs do not
// overlap: in a longer chain, each ste_backward joins at most one pair (the driver builds
// only candidates that share no node with an earlier one).
#include "ops/fused/ste_chain/ste_chain_fusion.h"

#include "core/graph_rewrite.h"
#include "ops/fused/common/ste_single_reader.h"

namespace qg {

// 2. Legal: the predicate, with the reason when it fails.
std::string ste_chain_fusion_blocker(const Graph& g, NodeId first_id, NodeId second_id) {
  const std::string why = ste_single_reader_blocker(g, first_id, second_id);
  if (!why.empty()) return why;
  const Node& second = g.node(second_id);
  if (second.op->name != "ste_backward") return second.op->name + " is not ste_backward";
  const ValueId t = g.node(first_id).outputs.at(0);
  if (second.inputs.size() != 2 || second.inputs[0] != t || second.inputs[1] == t)
    return "the second ste_backward does not read the masked gradient as dy only";
  return "";
}

namespace {

// 3. Build: one ste_backward-like node masking dy with both masks.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId first_id = c.nodes[0], second_id = c.nodes[1];
  const Node first = g.node(first_id);
  const Node second = g.node(second_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_ste_chain");
  fused.name = first.name + "+" + second.name;
  fused.inputs = {first.inputs.at(0), first.inputs.at(1), second.inputs.at(1)};
  fused.fused_from = {first, second};
  replace_with_fused_node(g, std::move(fused), {second.outputs[0]}, {second_id, first_id});
}

}  // namespace

// 1. Match: an ste_backward whose masked gradient has one reader (match_ste_single_reader,
//    ops/fused/common), then 2. and 3. above.
FusionRule ste_chain_fusion_rule() {
  return {"fuse_ste_chain", match_ste_single_reader,
          [](const Graph& g, const FusionCandidate& c) {
            return ste_chain_fusion_blocker(g, c.nodes[0], c.nodes[1]);
          },
          build};
}

}  // namespace qg
