// The fuse_dfq_cast rule.
//
//   before:                                         after:
//     w (f32) ─► dynamic_fake_quantize ─► y (f32)     w ─► dynamic_fake_quantize
//                   ├► mask, scale, zero_point              (out_dtype bf16) ─► y (bf16),
//     y ─► cast (bf16) ─► y16 ─► matmul                        mask, scale, zero_point
//
// Under a mixed-precision policy every quantized weight is fake-quantized in f32 and then cast
// to the GEMM's dtype: two passes over the weight and an f32 copy of it written and read back.
// The fused node writes the narrow copy straight away. Bit for bit the same: y16 is the one
// rounding of the same f32 value (dynamic_fake_quantize's out_dtype), and the backward graph,
// already built, reads the mask, not y (ste_backward), with the cast's backward unchanged.
// Legal when y has exactly one reader, the cast, and is not a graph output or named; x is f32
// and the cast narrows to bf16 or f16; the node has no out_dtype yet; and the cast has no
// control dependency (removing it would drop the ordering it carries). The dynamic_fake_quantize's
// own control dependencies (an optimizer step ordered after this reader of its weight) move to
// the fused node, which reads the same weight.
#include "ops/dynamic_fake_quantize/dfq_cast_fusion.h"

#include "core/graph_rewrite.h"
#include "core/op_registry.h"

namespace qg {
namespace {

// 1. Match: a cast whose input is a dynamic_fake_quantize's y: {dfq, cast}.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  const Node& cast = g.node(id);
  if (cast.op->name != "cast" || cast.inputs.size() != 1) return {};
  const Value& y = g.value(cast.inputs[0]);
  if (y.producer < 0 || g.node(y.producer).op->name != "dynamic_fake_quantize") return {};
  return {{{y.producer, id}}};
}

// 3. Build: the same op with out_dtype, its y in the cast's place.
void build(Graph& g, const FusionCandidate& c) {
  const Node dfq = g.node(c.nodes[0]);
  const Node cast = g.node(c.nodes[1]);
  Node fused;
  fused.op = dfq.op;
  fused.name = dfq.name + "+" + cast.name;
  fused.inputs = dfq.inputs;
  fused.attrs = dfq.attrs;
  fused.attrs.set("out_dtype", cast.attrs.get_string("dtype"));
  fused.fused_from = {dfq, cast};
  std::vector<TensorType> types;
  for (ValueId v : dfq.outputs) types.push_back(g.value(v).type);
  types[0] = g.value(cast.outputs[0]).type;
  std::vector<ValueId> replaced = dfq.outputs;
  replaced[0] = cast.outputs[0];
  const ControlEdges edges = control_edges(g, c.nodes[0]);
  const NodeId id =
      replace_with_fused_node(g, std::move(fused), replaced, {c.nodes[1], c.nodes[0]}, types);
  // The optimizer's update of the weight waits for every reader of it (train/optimizer.h):
  // the fused node reads it now, so it takes over those orderings.
  add_control_edges(g, edges, id);
}

}  // namespace

// 2. Legal: the predicate, with the reason when it fails.
std::string dfq_cast_fusion_blocker(const Graph& g, NodeId cast_id) {
  const Node& cast = g.node(cast_id);
  if (cast.op->name != "cast") return cast.op->name + " is not cast";
  const ValueId y = cast.inputs.at(0);
  const NodeId dfq_id = g.value(y).producer;
  if (dfq_id < 0 || g.node(dfq_id).op->name != "dynamic_fake_quantize")
    return "the cast does not read a dynamic_fake_quantize";
  const Node& dfq = g.node(dfq_id);
  if (dfq.outputs.at(0) != y) return "the cast reads another output than y";
  if (dfq.attrs.has("out_dtype") && dfq.attrs.get_string("out_dtype") != "input")
    return "the dynamic_fake_quantize already narrows its y";
  if (g.value(dfq.inputs.at(0)).type.dtype != DType::f32) return "x is not f32";
  const DType to = g.value(cast.outputs.at(0)).type.dtype;
  if (to != DType::bf16 && to != DType::f16) return "the cast does not narrow to bf16 or f16";
  if (g.is_output(y)) return "y is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(y);
  if (readers.size() != 1 || readers[0] != cast_id) return "y has another reader";
  if (!control_edges(g, cast_id).empty()) return "the cast has a control dependency";
  return "";
}

FusionRule dfq_cast_fusion_rule() {
  return {"fuse_dfq_cast", match,
          [](const Graph& g, const FusionCandidate& c) {
            return dfq_cast_fusion_blocker(g, c.nodes[1]);
          },
          build};
}

}  // namespace qg
