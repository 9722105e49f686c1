#include "core/graph_rewrite.h"

#include "core/error.h"

namespace qg {

void replace_all_uses(Graph& g, ValueId old, ValueId now) {
  for (NodeId reader : g.consumers(old)) {
    const size_t slots = g.node(reader).inputs.size();
    for (size_t slot = 0; slot < slots; ++slot)
      if (g.node(reader).inputs[slot] == old) g.replace_input(reader, static_cast<int>(slot), now);
  }
}

ControlEdges control_edges(const Graph& g, NodeId id) {
  ControlEdges c;
  const BoostGraph& bg = g.boost_graph();
  for (auto [e, end] = boost::in_edges(id, bg); e != end; ++e)
    if (bg[*e].value == kNoValue) c.before.push_back(static_cast<NodeId>(boost::source(*e, bg)));
  for (auto [e, end] = boost::out_edges(id, bg); e != end; ++e)
    if (bg[*e].value == kNoValue) c.after.push_back(static_cast<NodeId>(boost::target(*e, bg)));
  return c;
}

void add_control_edges(Graph& g, const ControlEdges& edges, NodeId to) {
  for (NodeId b : edges.before) g.add_control_dependency(b, to);
  for (NodeId a : edges.after) g.add_control_dependency(to, a);
}

namespace {

// Whether `n` took in node `id`: among its fused_from, or theirs (a fused node that a later
// pass fused again, as fuse_multi_tensor_adam takes the steps fuse_grad_cast rewrote).
bool took_in(const Node& n, NodeId id) {
  for (const Node& original : n.fused_from)
    if (original.id == id || took_in(original, id)) return true;
  return false;
}

}  // namespace

NodeId live_node(const Graph& g, NodeId node) {
  if (!g.node(node).dead) return node;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (!n.dead && took_in(n, node)) return id;
  }
  QG_FAIL("passes", "node ", node, " ('", g.node(node).name,
          "') was removed and no live fused node took it in");
}

NodeId replace_with_fused_node(Graph& g, Node fused, const std::vector<ValueId>& replaced,
                               const std::vector<NodeId>& originals,
                               std::vector<TensorType> types) {
  if (types.empty())
    for (ValueId v : replaced) types.push_back(g.value(v).type);
  const NodeId f = g.add_raw_node(std::move(fused), types);
  const std::vector<ValueId> outs = g.node(f).outputs;
  std::vector<std::string> names;
  std::vector<bool> marked;
  for (size_t i = 0; i < replaced.size(); ++i) {
    replace_all_uses(g, replaced[i], outs[i]);
    names.push_back(g.value(replaced[i]).name);
    marked.push_back(g.is_output(replaced[i]));
  }
  for (NodeId n : originals) g.remove_node(n);  // frees the names for the new outputs
  for (size_t i = 0; i < replaced.size(); ++i) {
    if (!names[i].empty()) g.set_name(outs[i], names[i]);
    if (marked[i]) g.mark_output(outs[i]);
  }
  return f;
}

}  // namespace qg
