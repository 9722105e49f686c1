// Part of the legality predicates of the rules that fuse an ste_backward into its one reader
// (fuse_ste_optimizer, fuse_ste_chain).
#pragma once

#include <string>

#include "core/graph.h"

namespace qg {

// Why the masked gradient t (the output of the ste_backward `ste`) may not disappear into
// `reader`: `ste` is no ste_backward, t is a graph output or named, or t has a reader other
// than `reader`. Empty when it may.
std::string ste_single_reader_blocker(const Graph& graph, NodeId ste, NodeId reader);

}  // namespace qg
