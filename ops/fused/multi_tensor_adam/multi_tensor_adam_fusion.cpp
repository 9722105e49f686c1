// The fuse_multi_tensor_adam rule: every adam step of a graph that shares its hyper-parameters
// and its parameter and gradient dtypes becomes one fused_multi_tensor_adam node, as
// fuse_multi_tensor_adamw does for adamw (multi_tensor_adamw_fusion.cpp): the first step is
// rewritten in place (it keeps its id, which callers hold as a run target), and the others'
// control dependencies move to it. Legal only when no step of the group is an ancestor of
// another's inputs, which the merged node would turn into a cycle.
#include <tuple>

#include "core/graph.h"
#include "ops/fused/common/step_group.h"
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"

namespace qg {
namespace {

using GroupKey = std::tuple<DType, DType, double, double, double, double, double>;

GroupKey key_of(const Graph& g, const Node& n) {
  const Attrs& a = n.attrs;
  return {g.value(n.inputs.at(0)).type.dtype,
          g.value(n.inputs.at(1)).type.dtype,
          a.get_real("lr"),
          a.get_real("beta1"),
          a.get_real("beta2"),
          a.get_real("eps"),
          a.get_real("weight_decay")};
}

std::vector<FusionCandidate> match(const Graph& g, NodeId id) {
  return match_step_group<GroupKey>(g, id, "adam", [&](const Node& n) { return key_of(g, n); });
}

void build(Graph& g, const FusionCandidate& c) {
  merge_step_group(g, c.nodes,
                   step_group_node(g, c.nodes, "fused_multi_tensor_adam", "multi_tensor_adam"));
}

}  // namespace

std::string multi_tensor_adam_blocker(const Graph& g, const std::vector<NodeId>& steps) {
  return step_group_blocker(g, steps, "adam");
}

FusionRule multi_tensor_adam_fusion_rule() {
  return {"fuse_multi_tensor_adam", match,
          [](const Graph& g, const FusionCandidate& c) {
            return multi_tensor_adam_blocker(g, c.nodes);
          },
          build};
}

}  // namespace qg
