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

}  // namespace qg
