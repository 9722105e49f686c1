// The fuse_channel_div_batch_norm rule (channel_div_bn_fusion.cpp), registered on
// fused_channel_div_batch_norm.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses a folded conv-bn block's channel_div -> batch_norm into one
// fused_channel_div_batch_norm node, and its batch_norm_backward -> channel_div_backward
// into one fused_channel_div_batch_norm_backward node, so the quotient x / s is never a
// graph value (see the .cpp for the legality predicate).
FusionRule channel_div_bn_fusion_rule();

// The nodes one rewrite replaces: the channel_div, the batch_norm reading its output and,
// when the graph has the block's backward, the batch_norm_backward and channel_div_backward
// reading it (else -1).
struct ChannelDivBatchNormBlock {
  NodeId div = -1, bn = -1, bn_backward = -1, div_backward = -1;
};

// Why the channel_div node `div` may not be fused; empty when it may, then `block` (when
// given) holds the nodes to replace.
std::string channel_div_fusion_blocker(const Graph& graph, NodeId div,
                                       ChannelDivBatchNormBlock* block = nullptr);

}  // namespace qg
