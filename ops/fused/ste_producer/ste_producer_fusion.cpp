// Element-wise producer + straight-through estimator fusion: the fuse_ste_producer rule.
//
//   before:                                              after:
//     g ─► permute ─► p ─► reshape ─► dy ─► ste_backward ─► dx     g, mask ─► fused_ste_producer
//                                     mask ─┘                                   ─► dx
//     a, b ─► add ─► dy ─► ste_backward ─► dx                     a, mask, b ─► fused_ste_producer
//               mask ─┘                                                         ─► dx
//
// The transformer's backward gives these: the q, k and v fake-quantizers' ste_backward reads
// the backward of the attention head split (a permute, then a reshape view), and the ln1
// output quantizer's reads the sum of the three projections' input gradients (an add).
// Masking the producer's output as it is written saves writing it and reading it back.
// Legal only when every value between the producer and the ste_backward (the producer's output
// and the reshape views of it) has exactly one reader, the next node of the chain, reading it
// as its first input only, and none is a graph output or named (fusion removes them, so
// nothing may fetch them); the producer is a permute or transpose, or an add whose operands
// have the output's shape and dtype (the kernel does not broadcast); and no node of the chain
// has a control dependency (a removed node would drop the ordering it carries).
#include "ops/fused/ste_producer/ste_producer_fusion.h"

#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/fused/common/control_edges.h"
#include "ops/fused/ste_producer/ste_producer.h"

namespace qg {
namespace {

// The nodes from the producer of ste's dy (reshape nodes walked through) to ste, in order.
std::vector<NodeId> chain_to(const Graph& g, NodeId ste) {
  std::vector<NodeId> chain = {ste};
  NodeId p = g.value(g.node(ste).inputs.at(0)).producer;
  while (g.node(p).op->name == "reshape" && g.node(p).inputs.size() == 1) {
    chain.push_back(p);
    p = g.value(g.node(p).inputs[0]).producer;
  }
  chain.push_back(p);
  std::reverse(chain.begin(), chain.end());
  return chain;
}

}  // namespace

// 2. Legal: the predicate, with the reason when it fails.
std::string ste_producer_fusion_blocker(const Graph& g, NodeId ste_id) {
  const Node& ste = g.node(ste_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  if (ste.inputs.size() != 2) return "the ste_backward does not have 2 inputs";
  const std::vector<NodeId> chain = chain_to(g, ste_id);
  const Node& producer = g.node(chain.front());
  const auto& ok = ste_fusible_producers();
  if (std::find(ok.begin(), ok.end(), producer.op->name) == ok.end())
    return producer.op->name + " is not a fusible producer";
  if (producer.outputs.size() != 1) return "the producer does not have exactly one output";
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    const ValueId v = g.node(chain[i]).outputs.at(0);
    const std::string what = "the output of " + g.node(chain[i]).op->name;
    if (g.is_output(v)) return what + " is a graph output or named (a run may fetch it)";
    const auto readers = g.consumers(v);
    if (readers.size() != 1 || readers[0] != chain[i + 1]) return what + " has another reader";
    const Node& reader = g.node(chain[i + 1]);
    for (size_t s = 0; s < reader.inputs.size(); ++s)
      if ((reader.inputs[s] == v) != (s == 0))
        return what + " is not read as the next node's first input only";
  }
  const TensorType& out = g.value(producer.outputs[0]).type;
  if (!is_floating(out.dtype)) return "the producer's output is not a float tensor";
  if (producer.op->name == "add") {
    if (producer.inputs.size() != 2) return "the add does not have 2 inputs";
    for (ValueId in : producer.inputs) {
      const TensorType& t = g.value(in).type;
      if (t.shape != out.shape || t.dtype != out.dtype)
        return "the add broadcasts (" + t.str() + " into " + out.str() + ")";
    }
  } else if (producer.inputs.size() != 1) {
    return "the " + producer.op->name + " does not have 1 input";
  }
  for (NodeId id : chain)
    if (has_control_edges(g, id))
      return g.node(id).op->name + " '" + g.node(id).name + "' has a control dependency";
  return "";
}

namespace {

// 1. Match: an ste_backward -> {producer, reshape..., ste_backward}, the chain up its dy.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "ste_backward" || n.inputs.size() != 2) return {};
  return {{chain_to(g, id)}};
}

// 3. Build. Chains never overlap (each value between a producer and its ste_backward has one
//    reader, so a producer or reshape belongs to one chain); each is read again from the graph
//    as it is now, since an earlier fusion may have rewired a producer's input.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId ste_id = c.nodes.back();
  const std::vector<NodeId> chain = chain_to(g, ste_id);
  const Node producer = g.node(chain.front());
  const Node ste = g.node(ste_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_ste_producer");
  fused.name = producer.name + "+" + ste.name;
  fused.inputs = {producer.inputs.at(0), ste.inputs.at(1)};
  if (producer.op->name == "add") fused.inputs.push_back(producer.inputs.at(1));
  for (NodeId id : chain) fused.fused_from.push_back(g.node(id));
  const std::vector<NodeId> readers_first(chain.rbegin(), chain.rend());
  replace_with_fused_node(g, std::move(fused), {ste.outputs[0]}, readers_first);
}

}  // namespace

FusionRule ste_producer_fusion_rule() {
  return {"fuse_ste_producer", match,
          [](const Graph& g, const FusionCandidate& c) {
            return ste_producer_fusion_blocker(g, c.nodes.back());
          },
          build};
}

}  // namespace qg
