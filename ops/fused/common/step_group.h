// Shared by the multi-tensor optimizer rules (fuse_multi_tensor_adam, fuse_multi_tensor_adamw):
// a group of one op's steps, keyed by what they must share, made into one fused node.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// The latest asynchronous node (OpDef::overlaps_async: a data-parallel gradient all-reduce)
// among the ancestors of step `id`'s gradient (input 1), or -1. Steps waiting on different
// collectives stay in different groups: a merged step would wait for the last bucket's
// all-reduce, where the steps of the earlier buckets run while it is still in flight.
NodeId step_collective(const Graph& g, NodeId id);

// The candidate rooted at `id`: every live node of `op` whose key and collective
// (step_collective) equal `id`'s, when `id` is the group's first (lowest id) and the group has
// two nodes at least; else none.
template <typename Key>
std::vector<FusionCandidate> match_step_group(const Graph& g, NodeId id, const std::string& op,
                                              const std::function<Key(const Node&)>& key_of) {
  const Node& first = g.node(id);
  if (first.dead || first.op->name != op) return {};
  const Key key = key_of(first);
  const NodeId collective = step_collective(g, id);
  FusionCandidate c;
  for (NodeId k = 0; k < g.num_nodes(); ++k) {
    const Node& n = g.node(k);
    if (n.dead || n.op->name != op || !(key_of(n) == key)) continue;
    if (k != id && step_collective(g, k) != collective) continue;
    if (k < id) return {};  // not the group's first step
    c.nodes.push_back(k);
  }
  if (c.nodes.size() < 2) return {};
  return {c};
}

// Why `steps` may not become one node: one is not a live node of `op`, or one is an ancestor
// of another's inputs (the merged node would make a cycle); empty when they may.
std::string step_group_blocker(const Graph& g, const std::vector<NodeId>& steps,
                               const std::string& op);

// The fused node of `steps` (op `fused_op`, named `prefix`.first step+count): inputs the
// (param, grad) pair of every step in order, the first step's attributes, every step's states
// concatenated (each keyed by its own step's name), the steps as fused_from. A rule appends
// the inputs the steps share.
Node step_group_node(const Graph& g, const std::vector<NodeId>& steps, const std::string& fused_op,
                     const std::string& prefix);

// Rewrites the first step into `fused` in place (it keeps its id, which callers hold as a run
// target; live_node() maps the others' ids to it through fused_from), removes the others and
// moves their control dependencies (each step's ordering after the readers of its parameter)
// to it.
void merge_step_group(Graph& g, const std::vector<NodeId>& steps, Node fused);

}  // namespace qg
