// A fusion rule: how a fused op replaces a chain of ordinary nodes. Each rule lives in the
// folder of the fused op it produces (ops/fused/<op>/) and is registered on that op's OpDef;
// runtime/passes holds only the driver that runs the rules in one ordered table, each under
// its pass name (QG_DISABLE_PASSES switches it off).
//
// A rule is three parts, run by the driver in this order:
//   1. match: the candidate chains rooted at one node (pattern by op names and edges);
//   2. legal: why a candidate may not be fused (another reader of an intermediate, an
//      intermediate that is a graph output or named, shapes or dtypes that do not fit), or
//      empty when it may;
//   3. build: rewrites one legal candidate into the fused node.
// Every candidate is matched and judged on the graph as it was before the pass; then, in
// order of `form` and within a form in topological order of the node that matched it, the
// candidates that share no node with an earlier accepted one are built, one after another.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qg {

class Graph;
using NodeId = int32_t;

// The nodes one rewrite would replace, in the rule's own order (-1 for an optional node the
// graph lacks); `form` tells a rule's patterns apart (e.g. forward and backward pairs).
struct FusionCandidate {
  std::vector<NodeId> nodes;
  int form = 0;
};

struct FusionRule {
  std::string name;  // the pass name: QG_DISABLE_PASSES and PassRecord key rules by it
  std::function<std::vector<FusionCandidate>(const Graph&, NodeId)> match;
  std::function<std::string(const Graph&, const FusionCandidate&)> legal;
  std::function<void(Graph&, const FusionCandidate&)> build;
};

}  // namespace qg
