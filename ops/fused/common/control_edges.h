// Shared by the fusion rules that remove nodes: whether a node carries a control dependency
// (an edge with no value, which orders it against another node), which a removed node would
// drop.
#pragma once

#include "core/graph.h"

namespace qg {

bool has_control_edges(const Graph& graph, NodeId id);

}  // namespace qg
