#include "ops/fused/common/ste_single_reader.h"

namespace qg {

std::string ste_single_reader_blocker(const Graph& g, NodeId ste_id, NodeId reader) {
  const Node& ste = g.node(ste_id);
  if (ste.op->name != "ste_backward") return ste.op->name + " is not ste_backward";
  const ValueId t = ste.outputs.at(0);
  if (g.is_output(t)) return "the masked gradient is a graph output or named (a run may fetch it)";
  const auto readers = g.consumers(t);
  if (readers.size() != 1 || readers[0] != reader) return "the masked gradient has another reader";
  return "";
}

std::vector<FusionCandidate> match_ste_single_reader(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op->name != "ste_backward") return {};
  const auto readers = g.consumers(n.outputs.at(0));
  if (readers.size() != 1) return {};
  return {{{id, readers[0]}}};
}

}  // namespace qg
