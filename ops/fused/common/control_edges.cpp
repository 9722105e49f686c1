#include "ops/fused/common/control_edges.h"

namespace qg {

bool has_control_edges(const Graph& g, NodeId id) {
  const BoostGraph& bg = g.boost_graph();
  for (auto [e, end] = boost::in_edges(id, bg); e != end; ++e)
    if (bg[*e].value == kNoValue) return true;
  for (auto [e, end] = boost::out_edges(id, bg); e != end; ++e)
    if (bg[*e].value == kNoValue) return true;
  return false;
}

}  // namespace qg
