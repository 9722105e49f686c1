// Straight-through estimator fusions with the STE's other readers in a QAT training step.
//
// 1. ste_backward + optimizer step (fuse_ste_optimizer):
//
//     dy ──► ste_backward ──► t ──► sgd(w, t)          dy ───┐
//     mask ──┘                                          mask ─┼─► fused_ste_optimizer(w, dy, mask)
//                                                       w ────┘
//
//    A fake-quantized weight's gradient is the STE-masked gradient of the quantized weight,
//    and in a training step its only reader is the weight's optimizer step. Legal only when
//    t has exactly one reader, an sgd or adam node reading it as its grad (not as its
//    param), and t is neither a graph output nor named (fusion removes it, so nothing may
//    fetch it: a gradient returned to the user, clipped or logged keeps its ste_backward).
//    The step node is rewritten in place (Graph::rewrite_node): it keeps its id, which
//    callers hold as a run target, its name and states, which checkpoints key, and its
//    control dependencies, which order the in-place update after every reader of the old
//    weight (nn::add_optimizer). The mask input adds only a data edge from the forward
//    fake-quantize, which those control dependencies already order before the step.
//
// 2. ste_backward + ste_backward (fuse_ste_chain):
//
//     dy ──► ste_backward ──► t ──► ste_backward ──► dx        dy ─────────┐
//     mask_first ──┘                mask_second ──┘             mask_first ─┼─► fused_ste_chain ─►
//     dx
//                                                               mask_second ┘
//
//    A value quantized twice (a quantized residual sum feeding the block's output quantizer)
//    masks its gradient twice. Legal only when t has exactly one reader, the second
//    ste_backward reading it as its dy, and t is neither a graph output nor named. Pairs do
//    not overlap: in a longer chain, each ste_backward joins at most one pair.
#include "runtime/passes/fuse_ste_optimizer.h"

#include <algorithm>
#include <set>

#include "ops/fused/fused_ste_optimizer.h"

namespace qg {
namespace {

// Why the masked gradient t = ste's output may not disappear into its single reader `reader`.
std::string single_reader_blocker(const Graph& g, NodeId ste_id, NodeId reader) {
  const Node& ste = g.node(ste_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  const ValueId t = ste.outputs.at(0);
  if (g.is_output(t)) return "the masked gradient is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(t);
  if (readers.size() != 1 || readers[0] != reader) return "the masked gradient has another reader";
  return "";
}

}  // namespace

std::string ste_optimizer_fusion_blocker(const Graph& g, NodeId ste_id, NodeId step_id) {
  const std::string why = single_reader_blocker(g, ste_id, step_id);
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

std::string ste_chain_fusion_blocker(const Graph& g, NodeId first_id, NodeId second_id) {
  const std::string why = single_reader_blocker(g, first_id, second_id);
  if (!why.empty()) return why;
  const Node& second = g.node(second_id);
  if (second.op->name != "ste_backward") return second.op->name + " is not ste_backward";
  const ValueId t = g.node(first_id).outputs.at(0);
  if (second.inputs.size() != 2 || second.inputs[0] != t || second.inputs[1] == t)
    return "the second ste_backward does not read the masked gradient as dy only";
  return "";
}

int FuseSteOptimizerPass::run(Graph& g) {
  std::vector<std::pair<NodeId, NodeId>> pairs;
  for (NodeId id : g.topological_order()) {
    const Node& n = g.node(id);
    if (n.op->name != "ste_backward") continue;
    const auto readers = g.consumers(n.outputs.at(0));
    if (readers.size() == 1 && ste_optimizer_fusion_blocker(g, id, readers[0]).empty())
      pairs.emplace_back(id, readers[0]);
  }
  const OpDef& fused_op = OpRegistry::instance().get("fused_ste_optimizer");
  for (auto [ste_id, step_id] : pairs) {
    const Node ste = g.node(ste_id);
    const Node step = g.node(step_id);
    Node fused;
    fused.op = &fused_op;
    fused.name = step.name;  // checkpoints key the step's states by its name
    fused.inputs = {step.inputs.at(0), ste.inputs.at(0), ste.inputs.at(1)};
    fused.attrs = step.attrs;
    fused.states = step.states;
    fused.fused_from = {ste, step};
    g.rewrite_node(step_id, std::move(fused));
    g.remove_node(ste_id);
  }
  return static_cast<int>(pairs.size());
}

int FuseSteChainPass::run(Graph& g) {
  std::vector<std::pair<NodeId, NodeId>> pairs;
  std::set<NodeId> taken;
  for (NodeId id : g.topological_order()) {
    const Node& n = g.node(id);
    if (n.op->name != "ste_backward" || taken.count(id)) continue;
    const auto readers = g.consumers(n.outputs.at(0));
    if (readers.size() != 1 || taken.count(readers[0])) continue;
    if (!ste_chain_fusion_blocker(g, id, readers[0]).empty()) continue;
    pairs.emplace_back(id, readers[0]);
    taken.insert(id);
    taken.insert(readers[0]);
  }
  const OpDef& fused_op = OpRegistry::instance().get("fused_ste_chain");
  for (auto [first_id, second_id] : pairs) {
    const Node first = g.node(first_id);
    const Node second = g.node(second_id);
    Node fused;
    fused.op = &fused_op;
    fused.name = first.name + "+" + second.name;
    fused.inputs = {first.inputs.at(0), first.inputs.at(1), second.inputs.at(1)};
    fused.fused_from = {first, second};
    replace_with_fused_node(g, std::move(fused), {second.outputs[0]}, {second_id, first_id});
  }
  return static_cast<int>(pairs.size());
}

}  // namespace qg
