// The fuse_multi_tensor_adamw rule: every adamw step of a graph that shares its rate input, its
// grad_scale input, its hyper-parameters and its parameter dtype becomes one
// fused_multi_tensor_adamw node.
//
//   adamw(p0, g0, lr, s)   adamw(p1, g1, lr, s)   ...     fused_multi_tensor_adamw(p0, g0, p1,
//                                                          g1, ..., lr, s)
//
// The first step (the lowest node id) is rewritten in place (Graph::rewrite_node): it keeps
// its id, which callers hold as a run target (live_node() maps the others' ids to it), and
// its control dependencies. The others' control dependencies, which order each in-place
// update after every reader of the old parameter (nn::add_optimizer) and before whatever
// reads the updated one (ZeRO's gather), move to the fused node. Legal only when no step of
// the group is an ancestor of another's inputs, which the merged node would turn into a cycle.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/graph.h"
#include "core/graph_rewrite.h"
#include "ops/fused/common/step_group.h"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"

namespace qg {
namespace {

// What the steps of one group share: the rate and scale values, the parameter dtype, the
// hyper-parameters.
using GroupKey = std::tuple<ValueId, ValueId, DType, double, double, double, double, bool>;

GroupKey key_of(const Graph& g, const Node& n) {
  const Attrs& a = n.attrs;
  return {n.inputs.at(2),
          n.inputs.at(3),
          g.value(n.inputs.at(0)).type.dtype,
          a.get_real("beta1"),
          a.get_real("beta2"),
          a.get_real("eps"),
          a.get_real("weight_decay"),
          a.get_bool("decoupled")};
}

// 1. Match: at the group's first step, the whole group (two steps at least), by node id.
std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  return match_step_group<GroupKey>(g, id, "adamw", [&](const Node& n) { return key_of(g, n); });
}

// 2. Legal: no step of the group among the ancestors of the group's inputs.
std::string blocker(const Graph& g, const FusionCandidate& c) {
  return step_group_blocker(g, c.nodes, "adamw");
}

// 3. Build: the first step rewritten into the fused node; the others' orderings moved to it.
void build(Graph& g, const FusionCandidate& c) {
  Node fused = step_group_node(g, c.nodes, "fused_multi_tensor_adamw", "multi_tensor_adamw");
  // Then the rate and the gradient scale every step of the group reads.
  fused.inputs.push_back(g.node(c.nodes.front()).inputs.at(2));
  fused.inputs.push_back(g.node(c.nodes.front()).inputs.at(3));
  merge_step_group(g, c.nodes, std::move(fused));
}

}  // namespace

FusionRule multi_tensor_adamw_fusion_rule() {
  return {"fuse_multi_tensor_adamw", match, blocker, build};
}

}  // namespace qg
