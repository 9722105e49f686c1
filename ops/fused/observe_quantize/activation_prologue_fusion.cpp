// Activation prologue fusion: the fuse_activation_prologue rule.
//
//   before:                                          after:
//     x ──► relu ──► h ──► fused_observe_quantize      x ──► fused_observe_quantize[relu]
//                            ──► y, mask, scale, zp          ──► y, mask, scale, zp
//
// In conv-bn-relu and the MLP's GELU the activation's output h feeds only the activation
// fake-quantizer: its backward reads the activation's input x (relu_backward(dy, x), and the
// same for gelu and silu), and the fake-quantizer's backward reads the mask. Writing h and
// reading it back twice (statistics, then quantize) is two of the five passes over the
// activation that the QAT step adds; the fused node applies the activation as it loads x.
// Legal only when h has exactly one reader, that fused node (reading it as x), h is neither
// a graph output nor named (fusion removes it, so nothing may fetch it), the activation has
// one input that is not a parameter, and the fused node has no prologue yet.
#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/observe_quantize/observe_quantize.h"
#include "ops/fused/observe_quantize/observe_quantize_fusion.h"

namespace qg {

// 2. Legal: the predicate, with the reason when it fails.
std::string prologue_fusion_blocker(const Graph& g, NodeId act_id, NodeId fused_id) {
  const Node& act = g.node(act_id);
  const Node& fused = g.node(fused_id);
  const auto& ok = prologue_activations();
  if (std::find(ok.begin(), ok.end(), act.op->name) == ok.end())
    return act.op->name + " is not a fusible activation";
  if (fused.op->name != "fused_observe_quantize")
    return fused.op->name + " is not fused_observe_quantize";
  if (prologue_activation(fused) != nullptr) return "the fused node already has a prologue";
  if (act.inputs.size() != 1 || act.outputs.size() != 1) return "activation arity does not fit";
  // Readers of a parameter carry control edges to its optimizer step (train/optimizer.cpp),
  // which rebuilding the nodes would drop; activations of parameters are left alone.
  if (g.node(g.value(act.inputs[0]).producer).op->name == "parameter")
    return "the activation reads a parameter";
  const ValueId h = act.outputs[0];
  if (g.is_output(h))
    return "the activation's output is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(h);
  if (readers.size() != 1 || readers[0] != fused_id)
    return "the activation's output has another reader";
  if (fused.inputs.size() != 1 || fused.inputs[0] != h)
    return "the fused node does not read the activation's output as x";
  return "";
}

namespace {

// 1. Match: a fused_observe_quantize node reading one value -> {its producer, the node}.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "fused_observe_quantize" || n.inputs.size() != 1) return {};
  const NodeId act = g.value(n.inputs[0]).producer;
  if (act < 0) return {};
  return {{{act, id}}};
}

// 3. Build: the fused node again, reading the activation's input and holding the activation
//    as its third fused_from node.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId act_id = c.nodes[0], fused_id = c.nodes[1];
  const Node act = g.node(act_id);
  Node fused = g.node(fused_id);
  const std::vector<ValueId> replaced = fused.outputs;
  fused.inputs = {act.inputs[0]};
  fused.outputs.clear();
  fused.fused_from.push_back(act);
  replace_with_fused_node(g, std::move(fused), replaced, {fused_id, act_id});
}

}  // namespace

FusionRule activation_prologue_fusion_rule() {
  return {"fuse_activation_prologue", match,
          [](const Graph& g, const FusionCandidate& c) {
            return prologue_fusion_blocker(g, c.nodes[0], c.nodes[1]);
          },
          build};
}

}  // namespace qg
