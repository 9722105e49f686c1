// Straight-through estimator + activation backward fusion: the fuse_ste_backward rule.
//
//   before:                                      after:
//     dy ──► ste_backward ──► t ──► relu_backward ──► dx      dy ─┐
//     mask ──┘                x ────┘                         mask ┼─► fused_ste_backward ──► dx
//                                                             x ──┘
//
// Where a fake-quantizer follows an activation (conv-bn-relu, the MLP's GELU), the gradient
// of the activation's output is the STE-masked gradient and nothing else reads it. Legal
// only when the masked gradient t has exactly one reader, the activation backward reading
// it as its dy (not as its x), and t is neither a graph output nor named (fusion removes
// it, so nothing may fetch it).
#include "ops/fused/ste_backward/ste_backward_fusion.h"

#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/common/ste_single_reader.h"
#include "ops/fused/ste_backward/ste_backward.h"

namespace qg {

// 2. Legal: the predicate, with the reason when it fails.
std::string ste_fusion_blocker(const Graph& g, NodeId ste_id, NodeId act_id) {
  const Node& ste = g.node(ste_id);
  const Node& act = g.node(act_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  const auto& ok = ste_fusible_consumers();
  if (std::find(ok.begin(), ok.end(), act.op->name) == ok.end())
    return act.op->name + " is not a fusible activation backward";
  const ValueId t = ste.outputs.at(0);
  if (g.is_output(t)) return "the masked gradient is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(t);
  if (readers.size() != 1 || readers[0] != act_id) return "the masked gradient has another reader";
  if (act.inputs.size() != 2 || act.inputs[0] != t || act.inputs[1] == t)
    return "the activation backward does not read the masked gradient as dy only";
  return "";
}

namespace {

// 3. Build: one node reading dy, the mask and the activation's x.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId ste_id = c.nodes[0], act_id = c.nodes[1];
  Node ste = g.node(ste_id);
  Node act = g.node(act_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_ste_backward");
  fused.name = ste.name + "+" + act.name;
  fused.inputs = {ste.inputs.at(0), ste.inputs.at(1), act.inputs.at(1)};
  fused.fused_from = {ste, act};
  replace_with_fused_node(g, std::move(fused), {act.outputs[0]}, {act_id, ste_id});
}

}  // namespace

// 1. Match: an ste_backward whose masked gradient has one reader (match_ste_single_reader,
//    ops/fused/common), then 2. and 3. above.
FusionRule ste_backward_fusion_rule() {
  return {"fuse_ste_backward", match_ste_single_reader,
          [](const Graph& g, const FusionCandidate& c) {
            return ste_fusion_blocker(g, c.nodes[0], c.nodes[1]);
          },
          build};
}

}  // namespace qg
