// The fuse_cast_add rule.
//
//   before:                                           after:
//     g16 (bf16) ─► cast (f32) ─► [reshape] ─► ga ─┐
//                                                 add ─► y     g16, h ─► fused_cast_add ─► y
//     h (f32) ───────────────────────────────────┘
//
// Each operand of an f32 add is taken back to the bf16/f16 value it was widened from, when it
// is a widening cast's output, possibly through reshape views (a reshape of a contiguous
// value is the same elements in the same order). Legal when: the add has two distinct
// operands of its output's shape and dtype f32 (the fused kernel does not broadcast); at least
// one operand is taken back; and for each taken operand every value from the cast's output to
// the add has exactly one reader, the next node of the chain, is not a graph output or named
// (fusion removes them, so nothing may fetch them), and no node of the chain, nor the add,
// has a control dependency (a removed node would drop the ordering it carries). An operand
// whose chain fails these stays as it is.
#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/cast_add/cast_add.h"
#include "ops/fused/common/control_edges.h"

namespace qg {
namespace {

bool widens_to_f32(const Graph& g, const Node& cast) {
  if (cast.op->name != "cast" || cast.inputs.size() != 1 || cast.outputs.size() != 1) return false;
  const DType from = g.value(cast.inputs[0]).type.dtype;
  return g.value(cast.outputs[0]).type.dtype == DType::f32 &&
         (from == DType::bf16 || from == DType::f16);
}

// The nodes from the widening cast to the last reshape before `add` (cast first), when
// `operand` (an input of `add`) can be taken back to the cast's input; else empty.
std::vector<NodeId> cast_chain(const Graph& g, NodeId add, ValueId operand) {
  std::vector<NodeId> chain;
  ValueId v = operand;
  NodeId reader = add;
  while (true) {
    if (g.is_output(v)) return {};
    const std::vector<NodeId> readers = g.consumers(v);
    if (readers.size() != 1 || readers[0] != reader) return {};
    const NodeId p = g.value(v).producer;
    if (p < 0 || has_control_edges(g, p)) return {};
    const Node& node = g.node(p);
    chain.push_back(p);
    if (widens_to_f32(g, node)) break;
    if (node.op->name != "reshape" || node.inputs.size() != 1) return {};
    v = node.inputs[0];
    reader = p;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// The fused node's operand for input `slot` of `add`: the cast's input, or the operand itself.
ValueId taken_back(const Graph& g, NodeId add, int slot) {
  const ValueId operand = g.node(add).inputs[slot];
  const std::vector<NodeId> chain = cast_chain(g, add, operand);
  return chain.empty() ? operand : g.node(chain.front()).inputs[0];
}

// 1. Match: an add -> {add, the nodes of each operand's chain}.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "add" || n.inputs.size() != 2) return {};
  FusionCandidate c;
  c.nodes = {id};
  for (ValueId operand : n.inputs)
    for (NodeId p : cast_chain(g, id, operand)) c.nodes.push_back(p);
  return {c};
}

// 3. Build: one fused node over the taken-back operands, y in the add's place; the add, then
//    each chain from the reader end, removed.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId add_id = c.nodes.front();
  const Node add = g.node(add_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_cast_add");
  fused.name = add.name;
  fused.inputs = {taken_back(g, add_id, 0), taken_back(g, add_id, 1)};
  std::vector<NodeId> originals = {add_id};
  for (int slot = 0; slot < 2; ++slot) {
    const std::vector<NodeId> chain = cast_chain(g, add_id, add.inputs[slot]);
    for (NodeId p : chain) fused.fused_from.push_back(g.node(p));
    originals.insert(originals.end(), chain.rbegin(), chain.rend());
  }
  fused.fused_from.push_back(add);
  replace_with_fused_node(g, std::move(fused), {add.outputs[0]}, originals);
}

}  // namespace

// 2. Legal: the predicate, with the reason when it fails.
std::string cast_add_fusion_blocker(const Graph& g, NodeId add_id) {
  const Node& add = g.node(add_id);
  if (add.op->name != "add") return add.op->name + " is not add";
  if (add.inputs.size() != 2 || add.outputs.size() != 1) return "the add does not have 2 inputs";
  if (add.inputs[0] == add.inputs[1]) return "the add reads one value twice";
  const TensorType& out = g.value(add.outputs[0]).type;
  if (out.dtype != DType::f32) return "the add is not f32";
  for (ValueId in : add.inputs)
    if (g.value(in).type.shape != out.shape)
      return "the add broadcasts (" + g.value(in).type.str() + " into " + out.str() + ")";
  if (has_control_edges(g, add_id)) return "the add has a control dependency";
  if (cast_chain(g, add_id, add.inputs[0]).empty() && cast_chain(g, add_id, add.inputs[1]).empty())
    return "no operand is a widening cast's output read by the add alone";
  return "";
}

FusionRule cast_add_fusion_rule() {
  return {"fuse_cast_add", match,
          [](const Graph& g, const FusionCandidate& c) {
            return cast_add_fusion_blocker(g, c.nodes.front());
          },
          build};
}

}  // namespace qg
