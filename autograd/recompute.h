// Activation recomputation (gradient checkpointing) as graph rewriting. A model marks spans of
// its forward graph (a decoder block each) as recompute regions; once the backward graph is
// built, recompute_regions() gives each region's backward its own copy of the region's
// forward nodes, run just before that backward, so the region's internal activations die in
// the forward and only what the region reads from outside (the block input, the weights)
// stays alive until the backward. The memory plan (runtime/memory_plan.h), which takes value
// lifetimes from the execution order, then shows the lower peak.
//
//   before:   x ─► [n1 ─► a ─► n2] ─► y ... loss ... dy ─► n2' ─► da ─► n1' ─► dx
//                        └────────────────────────────────┘ (a lives through the backward)
//   after:    x ─► [n1 ─► a ─► n2] ─► y ... loss ... dy ─┐
//             x ─────────────────────────────────► n1~ ──► a~ ─► n2' ─► da ─► n1' ─► dx
//             (dy ─► n1~ is a control dependency: the copy runs once the backward reaches
//             the region)
//
// Values and states equal the run without recomputation bit for bit: the copies run the same
// kernels on the same inputs. Nodes with persistent state (observers, batch norm, dropout's
// step counter) or side effects are never copied, since running them again would update
// their state a second time: the backward and the copies read their original outputs, which
// then stay alive as a region input does (so a region of stateful nodes saves less).
#pragma once

#include <string>
#include <vector>

#include "autograd/grad.h"

namespace qg {

// The forward nodes [begin, end) of one region, as a model appended them (node ids grow in
// creation order). Sources inside it (parameters, constants) are read, never copied.
struct RecomputeRegion {
  std::string name;
  NodeId begin = -1, end = -1;
};

struct RecomputeStats {
  int regions = 0;        // regions whose backward now reads copies
  int copied_nodes = 0;   // forward nodes copied, summed over the regions
  int kept_stateful = 0;  // stateful / side-effect nodes whose outputs the backward keeps
};

// Rewrites the backward nodes [backward_begin, backward_end) (what grad() appended) that read a
// region's internal values (outputs of its nodes that no forward node outside the region and no
// graph output reads) to read copies, and orders each region's copies after the gradient of the
// region's outputs (`value_grads`, from grad_with_value_grads) and after the backward readers of
// the next region's copies, so one region's copies are alive at a time (regions are given in
// forward order). Call it before optimizer nodes exist, so each update is ordered after the
// copies that read its parameter. A region whose outputs get no gradient is left as it is.
// Throws qg::Error (op "recompute") for a region outside the forward nodes, an empty one or
// overlapping ones.
RecomputeStats recompute_regions(Graph& graph, const std::vector<RecomputeRegion>& regions,
                                 NodeId backward_begin, NodeId backward_end,
                                 const GradientMap& value_grads);

}  // namespace qg
