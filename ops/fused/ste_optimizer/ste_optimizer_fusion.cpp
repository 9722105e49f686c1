// Straight-through estimator + optimizer step fusion: the fuse_ste_optimizer rule.
//
//     dy ──► ste_backward ──► t ──► sgd(w, t)          dy ───┐
//     mask ──┘                                          mask ─┼─► fused_ste_optimizer(w, dy, mask)
//                                                       w ────┘
//
// A fake-quantized weight's gradient is the STE-masked gradient of the quantized weight, and
// in a training step its only reader is the weight's optimizer step. Legal only when t has
// exactly one reader, an sgd or adam node reading it as its grad (not as its param), and t is
// neither a graph output nor named (fusion removes it, so nothing may fetch it: a gradient
// returned to the user, clipped or logged keeps its ste_backward). The step node is rewritten
// in place (Graph::rewrite_node): it keeps its id, which callers hold as a run target, its
// name and states, which checkpoints key, and its control dependencies, which order the
// in-place update after every reader of the old weight (nn::add_optimizer). The mask input
// adds only a data edge from the forward fake-quantize, which those control dependencies
// already order before the step.
#include "ops/fused/ste_optimizer/ste_optimizer_fusion.h"

#include <algorithm>

#include "ops/fused/common/ste_single_reader.h"
#include "ops/fused/ste_optimizer/ste_optimizer.h"

namespace qg {

// 2. Legal: the predicate, with the reason when it fails.
std::string ste_optimizer_fusion_blocker(const Graph& g, NodeId ste_id, NodeId step_id) {
  const std::string why = ste_single_reader_blocker(g, ste_id, step_id);
  if (!why.empty()) return why;
  const Node& step = g.node(step_id);
  const auto& ok = ste_fusible_optimizers();
  if (std::find(ok.begin(), ok.end(), step.op->name) == ok.end())
    return step.op->name + " is not a fusible optimizer step";
  const ValueId t = g.node(ste_id).outputs.at(0);
  if (step.inputs.size() != 2 || step.inputs[1] != t || step.inputs[0] == t)
    return "the step does not read the masked gradient as grad only";
  return "";
}

namespace {

// 3. Build: the step node rewritten in place, reading dy and the mask for its gradient.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId ste_id = c.nodes[0], step_id = c.nodes[1];
  const Node ste = g.node(ste_id);
  const Node step = g.node(step_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_ste_optimizer");
  fused.name = step.name;  // checkpoints key the step's states by its name
  fused.inputs = {step.inputs.at(0), ste.inputs.at(0), ste.inputs.at(1)};
  fused.attrs = step.attrs;
  fused.states = step.states;
  fused.fused_from = {ste, step};
  g.rewrite_node(step_id, std::move(fused));
  g.remove_node(ste_id);
}

}  // namespace

// 1. Match: an ste_backward whose masked gradient has one reader (match_ste_single_reader,
//    ops/fused/common), then 2. and 3. above.
FusionRule ste_optimizer_fusion_rule() {
  return {"fuse_ste_optimizer", match_ste_single_reader,
          [](const Graph& g, const FusionCandidate& c) {
            return ste_optimizer_fusion_blocker(g, c.nodes[0], c.nodes[1]);
          },
          build};
}

}  // namespace qg
