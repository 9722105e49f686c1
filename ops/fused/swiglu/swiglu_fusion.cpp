// The fuse_swiglu rule.
//
//   before:                                   after:
//     gate ─► silu ─► s ─► mul(s, up) ─► h       gate, up ─► fused_swiglu ─► h
//     dh ─► mul(dh, up) ─► ds ─► silu_backward(ds, gate) ─► dgate
//     dh ─► mul(dh, s) ─► dup                  dh, gate, up ─► fused_swiglu_backward
//                                                                 ─► dgate, dup
//
// The backward is matched with the forward because it reads s, which the fused pair no longer
// writes: the backward recomputes it from gate. The operand orders are the ones the model and
// autograd build (mul's backward is mul(dy, other operand)), which the fused kernels assume.
// Legal when: s is read by the forward mul (as its first operand) and the backward mul (as its
// second) and nothing else, and is not a graph output or named; ds is read by the
// silu_backward alone and is not an output or named; every tensor has one float dtype and one
// shape (no broadcasting); and none of the five nodes has a control dependency (removing them
// would drop the orderings they carry).
#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/common/control_edges.h"
#include "ops/fused/swiglu/swiglu.h"

namespace qg {
namespace {

struct SwigluNodes {
  NodeId silu = -1, mul = -1, mul_ds = -1, mul_du = -1, silu_backward = -1;
  std::string why;  // empty when found
};

bool is_mul(const Node& n) {
  return n.op->name == "mul" && n.inputs.size() == 2;
}

SwigluNodes refused(std::string why) {
  SwigluNodes f;
  f.why = std::move(why);
  return f;
}

SwigluNodes find(const Graph& g, NodeId silu_id) {
  SwigluNodes f;
  f.silu = silu_id;
  const Node& silu = g.node(silu_id);
  if (silu.op->name != "silu") return refused(silu.op->name + " is not silu");
  const ValueId s = silu.outputs.at(0), gate = silu.inputs.at(0);
  if (g.is_output(s)) return refused("s is a graph output or named (a run may fetch it)");
  for (NodeId r : g.consumers(s)) {
    const Node& n = g.node(r);
    if (!is_mul(n)) return refused("s is read by " + n.op->name);
    if (n.inputs[0] == s && n.inputs[1] != s && f.mul < 0)
      f.mul = r;
    else if (n.inputs[1] == s && n.inputs[0] != s && f.mul_du < 0)
      f.mul_du = r;
    else
      return refused("s is read by another mul");
  }
  if (f.mul < 0) return refused("no mul(s, up) reads s");
  if (f.mul_du < 0) return refused("no backward mul(dh, s) reads s");
  const ValueId up = g.node(f.mul).inputs[1], dh = g.node(f.mul_du).inputs[0];
  for (NodeId r : g.consumers(dh)) {
    const Node& n = g.node(r);
    if (is_mul(n) && n.inputs[0] == dh && n.inputs[1] == up) f.mul_ds = r;
  }
  if (f.mul_ds < 0) return refused("no backward mul(dh, up)");
  const ValueId ds = g.node(f.mul_ds).outputs.at(0);
  if (g.is_output(ds)) return refused("ds is a graph output or named (a run may fetch it)");
  const std::vector<NodeId> ds_readers = g.consumers(ds);
  if (ds_readers.size() != 1) return refused("ds has another reader");
  const Node& sb = g.node(ds_readers[0]);
  if (sb.op->name != "silu_backward" || sb.inputs.size() != 2 || sb.inputs[0] != ds ||
      sb.inputs[1] != gate)
    return refused("ds is not read by silu_backward(ds, gate)");
  f.silu_backward = ds_readers[0];
  const TensorType& t = g.value(gate).type;
  if (!is_floating(t.dtype)) return refused("gate is not a float tensor");
  for (ValueId v : {up, dh, s, ds, g.node(f.mul).outputs.at(0), g.node(f.mul_du).outputs.at(0),
                    sb.outputs.at(0)})
    if (!(g.value(v).type == t))
      return refused("the tensors differ in dtype or shape (" + g.value(v).type.str() + " and " +
                     t.str() + ")");
  for (NodeId n : {f.silu, f.mul, f.mul_ds, f.mul_du, f.silu_backward})
    if (has_control_edges(g, n))
      return refused(g.node(n).op->name + " '" + g.node(n).name + "' has a control dependency");
  return f;
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  if (g.node(id).op->name != "silu") return {};
  const SwigluNodes f = find(g, id);
  if (!f.why.empty()) return {};
  return {{{f.silu, f.mul, f.mul_ds, f.mul_du, f.silu_backward}}};
}

void build(Graph& g, const FusionCandidate& c) {
  const SwigluNodes f = find(g, c.nodes[0]);
  const Node silu = g.node(f.silu), mul = g.node(f.mul), mul_ds = g.node(f.mul_ds),
             mul_du = g.node(f.mul_du), sb = g.node(f.silu_backward);
  const ValueId gate = silu.inputs[0], up = mul.inputs[1], dh = mul_du.inputs[0];
  // The backward first: it reads s, which the forward's rewrite removes.
  Node back;
  back.op = &OpRegistry::instance().get("fused_swiglu_backward");
  back.name = silu.name + ".backward";
  back.inputs = {dh, gate, up};
  back.fused_from = {mul_ds, mul_du, sb};
  replace_with_fused_node(g, std::move(back), {sb.outputs[0], mul_du.outputs[0]},
                          {f.silu_backward, f.mul_ds, f.mul_du});
  Node fwd;
  fwd.op = &OpRegistry::instance().get("fused_swiglu");
  fwd.name = silu.name + "+" + mul.name;
  fwd.inputs = {gate, up};
  fwd.fused_from = {silu, mul};
  replace_with_fused_node(g, std::move(fwd), {mul.outputs[0]}, {f.mul, f.silu});
}

}  // namespace

std::string swiglu_fusion_blocker(const Graph& g, NodeId silu) {
  return find(g, silu).why;
}

FusionRule swiglu_fusion_rule() {
  return {
      "fuse_swiglu", match,
      [](const Graph& g, const FusionCandidate& c) { return swiglu_fusion_blocker(g, c.nodes[0]); },
      build};
}

}  // namespace qg
