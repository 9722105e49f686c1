// The shared parts of the rules that fuse an ste_backward into its one reader
// (fuse_ste_backward, fuse_ste_optimizer, fuse_ste_chain): the match and part of the legality
// predicate.
#pragma once

#include <string>
#include <vector>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Why the masked gradient t (the output of the ste_backward `ste`) may not disappear into
// `reader`: `ste` is no ste_backward, t is a graph output or named, or t has a reader other
// than `reader`. Empty when it may.
std::string ste_single_reader_blocker(const Graph& graph, NodeId ste, NodeId reader);

// The match of those rules: an ste_backward whose masked gradient has one reader ->
// {ste_backward, reader}; each rule's legality predicate then checks the reader.
std::vector<FusionCandidate> match_ste_single_reader(const Graph& graph, NodeId id);

}  // namespace qg
