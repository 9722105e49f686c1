#include "runtime/passes/merge_duplicates.h"

#include <map>
#include <utility>
#include <vector>

#include "core/graph_rewrite.h"

namespace qg {
namespace {

bool mergeable(const Graph& g, const Node& n) {
  if (n.dead || !n.states.empty() || !n.fused_from.empty()) return false;
  if (n.op->side_effects || n.op->is_source || n.op->overlaps_async) return false;
  // An aliasing op with one input is a view of it (reshape, stop_gradient); with more it may
  // write into input 0's buffer (bucket_put), and two writes are not one.
  if (n.op->aliases_input && n.inputs.size() != 1) return false;
  for (ValueId v : n.outputs)
    if (g.is_output(v)) return false;
  return control_edges(g, n.id).empty();
}

bool same_node(const Graph& g, const Node& a, const Node& b) {
  if (a.attrs.items() != b.attrs.items() || a.outputs.size() != b.outputs.size()) return false;
  for (size_t i = 0; i < a.outputs.size(); ++i)
    if (!(g.value(a.outputs[i]).type == g.value(b.outputs[i]).type)) return false;
  return true;
}

}  // namespace

int merge_duplicate_nodes(Graph& g) {
  // Candidates keyed by what must match exactly; attributes and types are compared within.
  std::map<std::pair<std::string, std::vector<ValueId>>, std::vector<NodeId>> seen;
  int removed = 0;
  for (NodeId id : g.topological_order()) {
    const Node& n = g.node(id);
    if (!mergeable(g, n)) continue;
    std::vector<NodeId>& same_key = seen[{n.op->name, n.inputs}];
    NodeId kept = -1;
    for (NodeId k : same_key)
      if (same_node(g, g.node(k), n)) kept = k;
    if (kept < 0) {
      same_key.push_back(id);
      continue;
    }
    const std::vector<ValueId> from = n.outputs, to = g.node(kept).outputs;
    for (size_t i = 0; i < from.size(); ++i) replace_all_uses(g, from[i], to[i]);
    g.remove_node(id);
    ++removed;
  }
  return removed;
}

}  // namespace qg
