// The fuse_norm_cast rule.
//
//   before:                                          after:
//     x (f32) ─► rms_norm ─► y (f32) ─► [reshape]      x ─► rms_norm (out_dtype bf16)
//                   └► rstd                ─► cast (bf16) ─► y16       ─► y' (bf16) ─► [reshape] ─►
//                   y16
//                                                                       └► rstd
//
// A bf16 mixed-precision decoder normalises its f32 residual stream and casts the result to
// the GEMMs' dtype (the q/k/v and gate/up inputs, the lm_head's): the norm writes an f32 copy
// and the cast reads it back. With out_dtype the norm writes the narrow copy itself, bit for
// bit the cast's (rms_norm_op.cpp), and the reshape views move after it. The backward graph,
// already built, reads x, the weight and rstd, not y, and the cast's backward is unchanged.
// Legal when: the rms_norm's x is f32 and it has no out_dtype yet; the cast narrows to bf16 or
// f16; every value from y to the cast has exactly one reader, the next node of the chain, and
// is not a graph output or named (fusion removes them); and neither the cast nor a reshape has
// a control dependency (a removed node would drop the ordering it carries). The rms_norm's own
// control dependencies (the optimizer's update of its weight, ordered after this reader) move
// to the new node, which reads the same weight.
#include "ops/rms_norm/rms_norm_cast_fusion.h"

#include <algorithm>

#include "core/graph_rewrite.h"
#include "core/op_registry.h"
#include "ops/fused/common/control_edges.h"

namespace qg {
namespace {

// The nodes from the rms_norm to the cast (rms_norm first, reshapes walked through), or empty
// when the cast's input does not come from an rms_norm's y that way.
std::vector<NodeId> chain_to(const Graph& g, NodeId cast) {
  std::vector<NodeId> chain = {cast};
  ValueId v = g.node(cast).inputs.at(0);
  while (true) {
    const NodeId p = g.value(v).producer;
    if (p < 0) return {};
    const Node& node = g.node(p);
    chain.push_back(p);
    if (node.op->name == "rms_norm") {
      if (node.outputs.at(0) != v) return {};
      break;
    }
    if (node.op->name != "reshape" || node.inputs.size() != 1) return {};
    v = node.inputs[0];
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "cast" || n.inputs.size() != 1) return {};
  std::vector<NodeId> chain = chain_to(g, id);
  if (chain.empty()) return {};
  return {{chain}};
}

void build(Graph& g, const FusionCandidate& c) {
  const std::vector<NodeId> chain = chain_to(g, c.nodes.back());
  const NodeId norm_id = chain.front(), cast_id = chain.back();
  const Node norm = g.node(norm_id);
  const Node cast = g.node(cast_id);
  const DType to = g.value(cast.outputs[0]).type.dtype;
  Node fused;
  fused.op = norm.op;
  fused.name = norm.name + "+" + cast.name;
  fused.inputs = norm.inputs;
  fused.attrs = norm.attrs;
  fused.attrs.set("out_dtype", cast.attrs.get_string("dtype"));
  fused.fused_from = {norm, cast};
  const ValueId y = norm.outputs[0], rstd = norm.outputs[1];
  const NodeId f =
      g.add_raw_node(std::move(fused), {{to, g.value(y).type.shape}, g.value(rstd).type});
  ValueId v = g.node(f).outputs[0];
  const ValueId new_rstd = g.node(f).outputs[1];
  // The reshape views, now of the narrow y.
  for (size_t i = 1; i + 1 < chain.size(); ++i) {
    Node view = g.node(chain[i]);
    const Shape shape = g.value(view.outputs[0]).type.shape;
    view.inputs = {v};
    view.outputs.clear();
    view.fused_from.clear();
    v = g.node(g.add_raw_node(std::move(view), {{to, shape}})).outputs[0];
  }
  const ValueId narrow = cast.outputs[0];
  const std::string narrow_name = g.value(narrow).name, rstd_name = g.value(rstd).name;
  const bool narrow_marked = g.is_output(narrow), rstd_marked = g.is_output(rstd);
  replace_all_uses(g, narrow, v);
  replace_all_uses(g, rstd, new_rstd);
  const ControlEdges edges = control_edges(g, norm_id);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) g.remove_node(*it);
  if (!narrow_name.empty()) g.set_name(v, narrow_name);
  if (narrow_marked) g.mark_output(v);
  if (!rstd_name.empty()) g.set_name(new_rstd, rstd_name);
  if (rstd_marked) g.mark_output(new_rstd);
  add_control_edges(g, edges, f);
}

}  // namespace

std::string rms_norm_cast_fusion_blocker(const Graph& g, NodeId cast_id) {
  const Node& cast = g.node(cast_id);
  if (cast.op->name != "cast") return cast.op->name + " is not cast";
  const std::vector<NodeId> chain = chain_to(g, cast_id);
  if (chain.empty()) return "the cast does not read an rms_norm's y (through reshape views)";
  const Node& norm = g.node(chain.front());
  if (norm.attrs.has("out_dtype") && norm.attrs.get_string("out_dtype") != "input")
    return "the rms_norm already narrows its y";
  if (g.value(norm.inputs.at(0)).type.dtype != DType::f32) return "x is not f32";
  const DType to = g.value(cast.outputs.at(0)).type.dtype;
  if (to != DType::bf16 && to != DType::f16) return "the cast does not narrow to bf16 or f16";
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    const ValueId v = g.node(chain[i]).outputs.at(0);
    const std::string what = i == 0 ? "y" : "a reshape view of y";
    if (g.is_output(v)) return what + " is a graph output or named (a run may fetch it)";
    const auto readers = g.consumers(v);
    if (readers.size() != 1 || readers[0] != chain[i + 1]) return what + " has another reader";
  }
  for (size_t i = 1; i < chain.size(); ++i)
    if (has_control_edges(g, chain[i]))
      return g.node(chain[i]).op->name + " '" + g.node(chain[i]).name +
             "' has a control dependency";
  return "";
}

FusionRule rms_norm_cast_fusion_rule() {
  return {"fuse_norm_cast", match,
          [](const Graph& g, const FusionCandidate& c) {
            return rms_norm_cast_fusion_blocker(g, c.nodes.back());
          },
          build};
}

}  // namespace qg
