// Observer + quantizer fusion: the fuse_observer_quantize rule.
//
//   before:                               after:
//     x ──► observer ──► scale ─┐           x ──► fused_observe_quantize ──► y, mask
//     │                 zp ─────┤                     (scale, zp as extra outputs)
//     └──────────────► quantizer ──► y, mask
//
// Legal only when the quantizer reads the same x the observer reads, the observer's scale
// and zero point have no reader other than the quantizer and are not graph outputs, and the
// two nodes agree on scope, axis, group size and integer range (so the qparams shapes fit
// and the fused kernel can quantize with what it observed).
#include <algorithm>

#include "core/graph_rewrite.h"
#include "ops/common/quant_attrs.h"
#include "ops/fused/observe_quantize/observe_quantize.h"
#include "ops/fused/observe_quantize/observe_quantize_fusion.h"

namespace qg {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string attr_or(const Attrs& a, const std::string& k) {
  return a.has(k) ? a.at(k).str() : "-";
}

}  // namespace

// 2. Legal: the predicate above, with the reason when it fails.
std::string fusion_blocker(const Graph& g, NodeId obs_id, NodeId q_id) {
  const Node& obs = g.node(obs_id);
  const Node& q = g.node(q_id);
  if (!contains(fusible_observers(), obs.op->name))
    return obs.op->name + " is not a fusible observer";
  if (!contains(fusible_quantizers(), q.op->name))
    return q.op->name + " is not a fusible quantizer";
  if (q.inputs.size() != 3 || q.outputs.size() != 2) return "quantizer arity does not fit";
  if (q.inputs[0] != obs.inputs.at(0)) return "observer and quantizer read different values";
  if (q.inputs[1] != obs.outputs.at(0) || q.inputs[2] != obs.outputs.at(1))
    return "quantizer does not take its qparams from this observer";
  for (ValueId v : obs.outputs) {
    if (g.is_output(v)) return "qparams value " + std::to_string(v) + " is a graph output";
    auto readers = g.consumers(v);
    if (readers.size() != 1 || readers[0] != q_id)
      return "qparams value " + std::to_string(v) + " has another reader";
  }
  for (const char* k : {"scope", "axis", "group_size"})
    if (attr_or(obs.attrs, k) != attr_or(q.attrs, k))
      return std::string("attribute '") + k + "' differs";
  QuantRange ro = quant_range_from_attrs(obs.op->name, obs.attrs);
  QuantRange rq = quant_range_from_attrs(q.op->name, q.attrs);
  if (ro.qmin != rq.qmin || ro.qmax != rq.qmax) return "integer ranges differ";
  return "";
}

namespace {

// 1. Match: a quantizer whose scale comes from an observer -> {observer, quantizer}.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& q = g.node(id);
  if (!contains(fusible_quantizers(), q.op->name) || q.inputs.size() < 2) return {};
  return {{{g.value(q.inputs[1]).producer, id}}};
}

// 3. Build the fused node from copies of the originals.
void build(Graph& g, const FusionCandidate& c) {
  const NodeId obs_id = c.nodes[0], q_id = c.nodes[1];
  Node obs = g.node(obs_id);
  Node q = g.node(q_id);
  Node fused;
  fused.op = &OpRegistry::instance().get("fused_observe_quantize");
  fused.name = obs.name + "+" + q.name;
  fused.inputs = {obs.inputs[0]};
  fused.states = obs.states;
  fused.states.insert(fused.states.end(), q.states.begin(), q.states.end());
  fused.fused_from = {obs, q};
  std::vector<TensorType> types = {g.value(q.outputs[0]).type, g.value(q.outputs[1]).type,
                                   g.value(obs.outputs[0]).type, g.value(obs.outputs[1]).type};
  // Rewire the quantizer's readers, carry names and output marks over, drop the pair (the
  // observer's qparams had no reader but the quantizer).
  replace_with_fused_node(g, std::move(fused), {q.outputs[0], q.outputs[1]}, {q_id, obs_id}, types);
}

}  // namespace

FusionRule observe_quantize_fusion_rule() {
  return {"fuse_observer_quantize", match,
          [](const Graph& g, const FusionCandidate& c) {
            return fusion_blocker(g, c.nodes[0], c.nodes[1]);
          },
          build};
}

}  // namespace qg
