// Scale + softmax fusion (attention's softmax(q k^T / sqrt(d))): the fuse_scaled_softmax rule.
//
//   forward:   x ──► mul(x, s) ──► t ──► softmax(axis -1) ──► y
//          =>  x, s ──► fused_scaled_softmax ──► y
//   backward:  dy, y ──► softmax_backward(axis -1) ──► g ──► mul(g, s) ──► dx
//          =>  dy, y, s ──► fused_scaled_softmax_backward ──► dx
//
// s is any value of one element (a rank-0 or [1, ...] constant, input or computed value;
// mul's shape inference already makes it x's dtype), as either operand of the mul. Legal
// only when the intermediate (t, g) has exactly one reader, the other node of the pair,
// reading it in one slot, and is neither a graph output nor named (fusion removes it, so
// nothing may fetch it); the mul's output must have its full operand's shape (a scalar of
// higher rank would broadcast it to a new shape); the softmax must run along the last axis
// (the CUDA kernels' row pass). The backward mul need not multiply by the forward's scale:
// the fused node computes exactly softmax_backward then mul, whichever scale it is.
#include "ops/fused/scaled_softmax/scaled_softmax_fusion.h"

#include "core/graph_rewrite.h"
#include "ops/softmax/softmax_columns.h"

namespace qg {
namespace {

// The slot of the mul's one-element operand that is not `other` (the operand of full
// shape); -1 when neither is such a scalar.
int scalar_slot(const Graph& g, const Node& mul, ValueId full) {
  for (int slot : {1, 0}) {
    const ValueId s = mul.inputs.at(slot), other = mul.inputs.at(1 - slot);
    if (other != full) continue;
    const Shape& shape = g.value(s).type.shape;
    if (shape_numel(shape) == 1) return slot;
  }
  return -1;
}

std::string common_blocker(const Graph& g, NodeId reader, ValueId mid) {
  if (g.is_output(mid)) return "the intermediate is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(mid);
  if (readers.size() != 1 || readers[0] != reader) return "the intermediate has another reader";
  int slots = 0;
  for (ValueId in : g.node(reader).inputs) slots += in == mid;
  if (slots != 1) return "the reader reads the intermediate in more than one slot";
  return "";
}

std::string last_axis_blocker(const Graph& g, const Node& n, ValueId v) {
  const int rank = static_cast<int>(g.value(v).type.shape.size());
  if (rank == 0) return "the softmax input is a scalar";
  if (softmax_axis(n.op->name, n.attrs, rank) != rank - 1)
    return "the softmax is not on the last axis";
  return "";
}

// The scale operand's slot of a fusible mul whose full operand is `full` and whose output
// has full's shape; -1 when it is not such a mul.
int mul_scale_slot(const Graph& g, const Node& mul, ValueId full) {
  if (mul.op->name != "mul") return -1;
  const int slot = scalar_slot(g, mul, full);
  if (slot < 0) return -1;
  if (g.value(mul.outputs.at(0)).type.shape != g.value(full).type.shape) return -1;
  return slot;
}

// The forward mul's scale slot: 1 for mul(x, s), else 0 for mul(s, x); -1 when neither.
int forward_scale_slot(const Graph& g, const Node& mul) {
  if (mul_scale_slot(g, mul, mul.inputs.at(0)) == 1) return 1;
  return mul_scale_slot(g, mul, mul.inputs.at(1)) == 0 ? 0 : -1;
}

}  // namespace

// 2. Legal: the predicates of the two forms, with the reason when they fail.
std::string scaled_softmax_blocker(const Graph& g, NodeId mul_id, NodeId sm_id) {
  const Node& mul = g.node(mul_id);
  const Node& sm = g.node(sm_id);
  if (mul.op->name != "mul") return mul.op->name + " is not mul";
  if (sm.op->name != "softmax") return sm.op->name + " is not softmax";
  const ValueId t = mul.outputs.at(0);
  std::string why = common_blocker(g, sm_id, t);
  if (!why.empty()) return why;
  if (forward_scale_slot(g, mul) < 0)
    return "the mul is not by a one-element value keeping the other operand's shape";
  return last_axis_blocker(g, sm, t);
}

std::string scaled_softmax_backward_blocker(const Graph& g, NodeId sb_id, NodeId mul_id) {
  const Node& sb = g.node(sb_id);
  const Node& mul = g.node(mul_id);
  if (sb.op->name != "softmax_backward") return sb.op->name + " is not softmax_backward";
  if (mul.op->name != "mul") return mul.op->name + " is not mul";
  const ValueId t = sb.outputs.at(0);
  std::string why = common_blocker(g, mul_id, t);
  if (!why.empty()) return why;
  if (mul_scale_slot(g, mul, t) < 0)
    return "the mul is not by a one-element value keeping the gradient's shape";
  return last_axis_blocker(g, sb, t);
}

namespace {

enum Form { kForward = 0, kBackward = 1 };

// 1. Match: a mul or softmax_backward whose output has one reader -> {it, the reader}. The
//    driver builds every forward pair before any backward pair, and a node joins at most one
//    pair: a mul may be both a softmax_backward's reader and a softmax's producer (a gradient
//    fed into another softmax), and then its forward pair takes it.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "mul" && n.op->name != "softmax_backward") return {};
  const auto readers = g.consumers(n.outputs.at(0));
  if (readers.size() != 1) return {};
  return {{{id, readers[0]}, n.op->name == "mul" ? kForward : kBackward}};
}

std::string legal(const Graph& g, const FusionCandidate& c) {
  if (c.form == kForward) return scaled_softmax_blocker(g, c.nodes[0], c.nodes[1]);
  return scaled_softmax_backward_blocker(g, c.nodes[0], c.nodes[1]);
}

// 3. Build: mul + softmax -> fused_scaled_softmax(x, s); softmax_backward + mul ->
//    fused_scaled_softmax_backward(dy, y, s).
void build(Graph& g, const FusionCandidate& c) {
  if (c.form == kForward) {
    const NodeId mul_id = c.nodes[0], sm_id = c.nodes[1];
    Node mul = g.node(mul_id);
    Node sm = g.node(sm_id);
    const int slot = forward_scale_slot(g, mul);
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_scaled_softmax");
    fused.name = mul.name + "+" + sm.name;
    fused.inputs = {mul.inputs[1 - slot], mul.inputs[slot]};
    fused.attrs = Attrs{{"axis", sm.attrs.get_int("axis")}, {"scale_first", int64_t{slot == 0}}};
    fused.fused_from = {mul, sm};
    replace_with_fused_node(g, std::move(fused), {sm.outputs[0]}, {sm_id, mul_id});
    return;
  }
  const NodeId sb_id = c.nodes[0], mul_id = c.nodes[1];
  Node sb = g.node(sb_id);
  Node mul = g.node(mul_id);
  const int slot = mul_scale_slot(g, mul, sb.outputs[0]);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_scaled_softmax_backward");
  fused.name = sb.name + "+" + mul.name;
  fused.inputs = {sb.inputs.at(0), sb.inputs.at(1), mul.inputs[slot]};
  fused.attrs = Attrs{{"axis", sb.attrs.get_int("axis")}, {"scale_first", int64_t{slot == 0}}};
  fused.fused_from = {sb, mul};
  replace_with_fused_node(g, std::move(fused), {mul.outputs[0]}, {mul_id, sb_id});
}

}  // namespace

FusionRule scaled_softmax_fusion_rule() {
  return {"fuse_scaled_softmax", match, legal, build};
}

}  // namespace qg
