// Straight-through estimator + the two multiplies that read it: the fuse_ste_mul_pair rule.
//
//   before:                                                  after:
//     dy ─► ste_backward ─► t ─► reshape ─► v ─► mul(v, a) ─► ya     dy, mask, a, b ─►
//     mask ─┘                                └─► mul(v, b) ─► yb       fused_ste_mul_pair ─► ya, yb
//
// A Llama block's QAT backward has it once per layer. The down projection's input quantizer
// masks the gradient of the SwiGLU product silu(gate) * up, and each factor's gradient is that
// masked gradient times the other factor. Unfused, the masked gradient ([tokens, intermediate])
// is written once and read twice; the fused node reads dy, the mask bits, a and b once and
// writes the two products.
// Legal only when: each value from t to v (the masked gradient and its reshape views) has one
// reader, the next node, except v, whose readers are exactly two muls; none is a graph output
// or named (fusion removes them, so nothing may fetch them); each mul reads v in exactly one
// input, and its other input has v's shape and dtype (the kernel does not broadcast); v is a
// float tensor; no node of the chain and neither mul has a control dependency (a removed node
// would drop the ordering it carries).
#include "ops/fused/ste_mul_pair/ste_mul_pair_fusion.h"

#include <algorithm>

#include "core/graph.h"
#include "core/graph_rewrite.h"
#include "ops/fused/common/control_edges.h"

namespace qg {
namespace {

// {ste, reshape views...}: the ste_backward and the views its masked gradient goes through,
// each the only reader of the previous node's output.
std::vector<NodeId> view_chain(const Graph& g, NodeId ste) {
  std::vector<NodeId> chain = {ste};
  for (;;) {
    const auto readers = g.consumers(g.node(chain.back()).outputs.at(0));
    if (readers.size() != 1 || g.node(readers[0]).op->name != "reshape") return chain;
    chain.push_back(readers[0]);
  }
}

// The masked gradient's last view (v above) and its readers, the muls first by node id.
ValueId last_view(const Graph& g, const std::vector<NodeId>& chain) {
  return g.node(chain.back()).outputs.at(0);
}

std::vector<NodeId> muls_of(const Graph& g, const std::vector<NodeId>& chain) {
  std::vector<NodeId> readers = g.consumers(last_view(g, chain));
  std::sort(readers.begin(), readers.end());
  readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
  return readers;
}

// The slot (0 or 1) in which `mul` reads v.
int64_t slot_of(const Node& mul, ValueId v) {
  return mul.inputs.at(0) == v ? 0 : 1;
}

}  // namespace

// 2. Legal: the predicate, with the reason when it fails.
std::string ste_mul_pair_fusion_blocker(const Graph& g, NodeId ste_id) {
  const Node& ste = g.node(ste_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  if (ste.inputs.size() != 2) return "the ste_backward does not have 2 inputs";
  const std::vector<NodeId> chain = view_chain(g, ste_id);
  for (NodeId id : chain) {
    const ValueId out = g.node(id).outputs.at(0);
    if (g.is_output(out))
      return "the output of " + g.node(id).op->name +
             " is a graph output or named (a run may "
             "fetch it)";
    if (has_control_edges(g, id))
      return g.node(id).op->name + " '" + g.node(id).name + "' has a control dependency";
  }
  for (size_t i = 1; i < chain.size(); ++i)
    if (g.node(chain[i]).inputs.size() != 1) return "a reshape does not have 1 input";
  const ValueId v = last_view(g, chain);
  const TensorType& vt = g.value(v).type;
  if (!is_floating(vt.dtype)) return "the masked gradient is not a float tensor";
  const std::vector<NodeId> muls = muls_of(g, chain);
  if (g.consumers(v).size() != 2 || muls.size() != 2)
    return "the masked gradient does not have exactly two readers, each reading it once";
  for (NodeId m : muls) {
    const Node& mul = g.node(m);
    if (mul.op->name != "mul") return "a reader of the masked gradient is " + mul.op->name;
    if (mul.inputs.size() != 2 || (mul.inputs[0] == v) == (mul.inputs[1] == v))
      return "a mul does not read the masked gradient in exactly one input";
    const TensorType& other = g.value(mul.inputs[1 - slot_of(mul, v)]).type;
    if (other.shape != vt.shape || other.dtype != vt.dtype)
      return "a mul broadcasts (" + other.str() + " with " + vt.str() + ")";
    if (g.value(mul.outputs.at(0)).type.shape != vt.shape)
      return "a mul's output does not have the masked gradient's shape";
    if (has_control_edges(g, m)) return "mul '" + mul.name + "' has a control dependency";
  }
  return "";
}

namespace {

// 1. Match: an ste_backward -> {ste_backward, reshape views..., mul, mul}, or nothing when its
//    masked gradient does not end in two readers.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "ste_backward" || n.inputs.size() != 2) return {};
  FusionCandidate c{view_chain(g, id)};
  const std::vector<NodeId> muls = muls_of(g, c.nodes);
  if (muls.size() != 2) return {};
  c.nodes.insert(c.nodes.end(), muls.begin(), muls.end());
  return {c};
}

// 3. Build: one node reading dy, the mask and each mul's other operand, with the slot each mul
//    read the masked gradient in (the kernels multiply in the mul's own operand order).
void build(Graph& g, const FusionCandidate& c) {
  const NodeId ste_id = c.nodes.front();
  const std::vector<NodeId> chain = view_chain(g, ste_id);
  const std::vector<NodeId> muls = muls_of(g, chain);
  const ValueId v = last_view(g, chain);
  const Node ste = g.node(ste_id);
  const Node mul_a = g.node(muls[0]), mul_b = g.node(muls[1]);
  const int64_t slot_a = slot_of(mul_a, v), slot_b = slot_of(mul_b, v);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_ste_mul_pair");
  fused.name = ste.name + "+" + mul_a.name + "+" + mul_b.name;
  fused.inputs = {ste.inputs.at(0), ste.inputs.at(1), mul_a.inputs.at(1 - slot_a),
                  mul_b.inputs.at(1 - slot_b)};
  fused.attrs.set("a_slot", slot_a);
  fused.attrs.set("b_slot", slot_b);
  for (NodeId id : chain) fused.fused_from.push_back(g.node(id));
  fused.fused_from.push_back(mul_a);
  fused.fused_from.push_back(mul_b);
  std::vector<NodeId> readers_first = {muls[1], muls[0]};
  readers_first.insert(readers_first.end(), chain.rbegin(), chain.rend());
  replace_with_fused_node(g, std::move(fused), {mul_a.outputs.at(0), mul_b.outputs.at(0)},
                          readers_first);
}

}  // namespace

FusionRule ste_mul_pair_fusion_rule() {
  return {"fuse_ste_mul_pair", match,
          [](const Graph& g, const FusionCandidate& c) {
            return ste_mul_pair_fusion_blocker(g, c.nodes.front());
          },
          build};
}

}  // namespace qg
