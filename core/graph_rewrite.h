// Graph edits shared by the fusion rules (ops/fused/*) and the code that reaches nodes a
// fusion may have removed (nn's trainer).
#pragma once

#include <vector>

#include "core/graph.h"

namespace qg {

// Points every input slot that reads `old` at `now` instead (a fusion rule's rewiring of the
// readers of a value it replaces).
void replace_all_uses(Graph& graph, ValueId old, ValueId now);

// A fusion rule's rewrite: adds `fused` with outputs of `types` (default: the types of
// `replaced`), points the readers of replaced[i] at the fused node's output i, removes
// `originals` in the given order (readers before producers), and gives output i the name and
// output mark replaced[i] had. Returns the fused node's id.
NodeId replace_with_fused_node(Graph& graph, Node fused, const std::vector<ValueId>& replaced,
                               const std::vector<NodeId>& originals,
                               std::vector<TensorType> types = {});

// The control dependencies of `id`: the nodes it must follow and those that must follow it (a
// fusion that replaces a node moves them to the fused node, so the orderings they carry stay).
struct ControlEdges {
  std::vector<NodeId> before, after;
  bool empty() const { return before.empty() && after.empty(); }
};
ControlEdges control_edges(const Graph& graph, NodeId id);

// Gives `to` the orderings `edges` held (taken by control_edges() from a node a fusion
// replaces): every node of edges.before before it, every node of edges.after after it.
void add_control_edges(Graph& graph, const ControlEdges& edges, NodeId to);

// `node` itself while it is live; once a fusion removed it, the live fused node that took it
// in (whose fused_from holds it), so code that kept a NodeId from graph building (nn's
// ConvBnLayer::bn_node) still reaches the node holding its states. Throws when none.
NodeId live_node(const Graph& graph, NodeId node);

}  // namespace qg
