// ZeRO stage 1: optimizer-state sharding for data-parallel training. Each parameter is
// owned by one rank, which alone holds its optimizer state (Adam's two moments: 2x the
// parameter's bytes) and applies its update; the updated parameters then travel to every
// rank in one all-gather per step. The gradients are still averaged in full on every rank
// (gradient_sync.h), so each update reads the same averaged gradient as without sharding:
// the parameters and the owned states are bit for bit those of an unsharded run.
//
// Ownership is by whole parameters (as PyTorch's ZeroRedundancyOptimizer partitions), not by
// slices of a flattened buffer, so the optimizer kernels run unchanged on their own tensors:
// the largest parameter goes first to the least-loaded rank (ties: the lower rank), which
// keeps the shards within one parameter's size of each other.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/compile.h"

namespace qg::dist {

struct ShardPlan {
  std::vector<int> owner;       // per parameter, the rank that updates it
  std::vector<int64_t> offset;  // per parameter, its first element in its owner's shard
  int64_t shard_elements = 0;   // the largest rank's shard (every shard is padded to it)
};

// The plan for parameters of `numels` elements over `ranks` ranks; every rank must own at
// least one parameter (qg::Error otherwise). The same on every rank: it depends on nothing else.
ShardPlan plan_optimizer_shards(const std::vector<int64_t>& numels, int ranks);

// `inner` (the optimizer's node builder) applied to this rank's parameters only, followed by
// the all-gather of the updated parameters. Returns the nodes a step runs as targets.
OptimizerNodes shard_optimizer_states(OptimizerNodes inner, int rank, int ranks);

}  // namespace qg::dist
