// The driver's own pass, run before the fusion rules: nodes that compute the same thing become
// one. A bf16-mixed decoder's q, k and v projections each cast the same (shared, quantized)
// input to bf16, as torch.autocast casts once per Linear; so do the MLP's gate and up
// projections. Three identical casts read one value and write three equal results: the merge
// keeps the first and points the others' readers at it. The builder cannot share the cast
// itself without changing the gradients (nn/builder.h, GemmInputSharing::with_cast); this pass
// runs after autograd, so it can.
//
// Two nodes are the same when they have the same op, equal attributes, the same input values
// in the same order and the same output types. Merged are only nodes whose result depends on
// nothing else: no states (observers, dropout's step), no side effects, not a source, not an
// asynchronous collective, not an aliasing op that reads more than one input (bucket_put
// writes its bucket in place; a one-input alias such as reshape is a view and merges), not a
// fused node, no control dependency (activation
// recomputation orders its copies of a block's nodes with those: merging a copy with its
// original would undo the recomputation), and no output marked as a graph output. Nodes are
// visited in topological order, so chains merge whole (dfq -> reshape -> cast).
//
// The backward graph is not changed in shape: each merged node's readers keep their own
// gradient nodes, so the gradients are the same bit for bit.
#pragma once

#include "core/graph.h"

namespace qg {

// Merges the duplicates of `graph`; returns how many nodes it removed.
int merge_duplicate_nodes(Graph& graph);

}  // namespace qg
