// channel_div + batch_norm fusion (a folded conv-bn block, nn/conv_bn.cpp): the
// fuse_channel_div_batch_norm rule.
//
//   before:                                         after:
//     conv ─► channel_div ─► q ─► batch_norm ─► y     conv ─► fused_channel_div_batch_norm ─► y
//     s ──────┘              │                        s ──────┘
//     dy ─► batch_norm_backward(dy, q) ─► t           dy ─► fused_channel_div_batch_norm_backward
//           channel_div_backward(t, q, s) ─► dconv, ds      ─► dconv, ds, dgamma, dbeta
//
// Legal only when every reader of the quotient q goes away with the rewrite, so q leaves the
// graph (its memory is the point): q is neither a graph output nor named; it has exactly one
// batch_norm reader, reading it as x only; and its other readers, if any, are exactly one
// batch_norm_backward reading it as x only and one channel_div_backward reading it as y only,
// whose dy is that batch_norm_backward's dx and whose s is the channel_div's s. That dx must
// have no other reader and be neither an output nor named (the fused backward never forms
// it). A forward without the backward pair (inference graphs) fuses the forward alone.
//
// The fused forward node takes the batch_norm's name and states, so checkpoints (keyed by
// node name) and the `frozen` flag carry over; live_node() maps the removed batch_norm's id
// to it.
#include "ops/fused/channel_div_bn/channel_div_bn_fusion.h"

#include "core/graph_rewrite.h"
#include "ops/fused/channel_div_bn/channel_div_bn.h"

namespace qg {
namespace {

// Whether `node` reads `v` in input slot `slot` and in no other.
bool reads_only_at(const Node& node, ValueId v, size_t slot) {
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if ((node.inputs[i] == v) != (i == slot)) return false;
  return true;
}

std::vector<TensorType> types_of(const Graph& g, const std::vector<ValueId>& values) {
  std::vector<TensorType> t;
  for (ValueId v : values) t.push_back(g.value(v).type);
  return t;
}

}  // namespace

// 2. Legal: the predicate, with the reason when it fails; `block` gets the nodes to replace.
std::string channel_div_fusion_blocker(const Graph& g, NodeId div_id,
                                       ChannelDivBatchNormBlock* block) {
  const Node& div = g.node(div_id);
  if (div.dead) return "the node was removed";
  if (div.op->name != "channel_div") return div.op->name + " is not channel_div";
  const ValueId q = div.outputs.at(0);
  if (g.is_output(q)) return "the quotient is a graph output or named (a run may fetch it)";
  ChannelDivBatchNormBlock b;
  b.div = div_id;
  for (NodeId r : g.consumers(q)) {
    const Node& n = g.node(r);
    NodeId* slot = nullptr;
    size_t x_slot = 0;
    if (n.op->name == "batch_norm") {
      slot = &b.bn;
    } else if (n.op->name == "batch_norm_backward") {
      slot = &b.bn_backward;
      x_slot = 1;
    } else if (n.op->name == "channel_div_backward") {
      slot = &b.div_backward;
      x_slot = 1;
    } else {
      return "the quotient has another reader (" + n.op->name + ")";
    }
    if (*slot != -1) return "the quotient has two " + n.op->name + " readers";
    if (!reads_only_at(n, q, x_slot))
      return n.op->name + " reads the quotient in another slot than its x";
    *slot = r;
  }
  if (b.bn == -1) return "no batch_norm reads the quotient";
  if ((b.bn_backward == -1) != (b.div_backward == -1))
    return "the quotient has only one of batch_norm_backward and channel_div_backward as reader";
  if (b.bn_backward != -1) {
    const Node& bb = g.node(b.bn_backward);
    const Node& db = g.node(b.div_backward);
    const ValueId t = bb.outputs.at(0);
    if (db.inputs.at(0) != t || !reads_only_at(db, t, 0))
      return "channel_div_backward's dy is not the batch_norm_backward's dx";
    if (db.inputs.at(2) != div.inputs.at(1))
      return "channel_div_backward divides by another s than the channel_div";
    if (g.is_output(t)) return "the batch_norm_backward's dx is a graph output or named";
    if (g.consumers(t).size() != 1) return "the batch_norm_backward's dx has another reader";
  }
  if (block != nullptr) *block = b;
  return "";
}

namespace {

// 1. Match: a channel_div -> {channel_div, batch_norm, batch_norm_backward,
//    channel_div_backward}: the quotient's readers of those kinds (-1 for a kind missing).
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& div = g.node(id);
  if (div.op->name != "channel_div") return {};
  ChannelDivBatchNormBlock b;
  b.div = id;
  for (NodeId r : g.consumers(div.outputs.at(0))) {
    const std::string& op = g.node(r).op->name;
    if (op == "batch_norm") b.bn = r;
    if (op == "batch_norm_backward") b.bn_backward = r;
    if (op == "channel_div_backward") b.div_backward = r;
  }
  return {{{b.div, b.bn, b.bn_backward, b.div_backward}}};
}

// 3. Build.
void build(Graph& g, const FusionCandidate& c) {
  const ChannelDivBatchNormBlock b{c.nodes[0], c.nodes[1], c.nodes[2], c.nodes[3]};
  const OpDef& fwd_op = OpRegistry::instance().get("fused_channel_div_batch_norm");
  const OpDef& back_op = OpRegistry::instance().get("fused_channel_div_batch_norm_backward");
  const Node div = g.node(b.div);
  const Node bn = g.node(b.bn);
  // Forward: the batch norm's name, attributes (via fused_from) and states.
  Node fwd;
  fwd.op = &fwd_op;
  fwd.name = bn.name;
  fwd.inputs = {div.inputs[0], div.inputs[1], bn.inputs[1],
                bn.inputs[2],  bn.inputs[3],  bn.inputs[4]};
  fwd.states = bn.states;
  fwd.fused_from = {div, bn};
  const std::vector<ValueId> fwd_inputs = fwd.inputs;
  // The batch norm's outputs have no reader left once rewired: it goes now; the quotient
  // is still read by the backward pair, so channel_div goes last.
  replace_with_fused_node(g, std::move(fwd), bn.outputs, {b.bn},
                          fused_channel_div_batch_norm_types(types_of(g, fwd_inputs)));
  // Backward, reading the forward's (rewired) saved statistics.
  if (b.bn_backward != -1) {
    const Node bb = g.node(b.bn_backward);
    const Node db = g.node(b.div_backward);
    Node back;
    back.op = &back_op;
    back.name = bb.name + "+" + db.name;
    back.inputs = {bb.inputs[0], div.inputs[0], div.inputs[1], bb.inputs[2],
                   bb.inputs[3], bb.inputs[4],  bb.inputs[5]};
    back.fused_from = {div, bb, db};
    const std::vector<TensorType> types =
        fused_channel_div_batch_norm_backward_types(types_of(g, back.inputs));
    replace_with_fused_node(g, std::move(back),
                            {db.outputs[0], db.outputs[1], bb.outputs[1], bb.outputs[2]},
                            {b.div_backward, b.bn_backward}, types);
  }
  g.remove_node(b.div);
}

}  // namespace

FusionRule channel_div_bn_fusion_rule() {
  return {"fuse_channel_div_batch_norm", match,
          [](const Graph& g, const FusionCandidate& c) {
            return channel_div_fusion_blocker(g, c.nodes[0]);
          },
          build};
}

}  // namespace qg
