// The fused channel_div + batch_norm ops of a folded conv-bn block (see
// channel_div_bn_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Output types of fused_channel_div_batch_norm for inputs {x, s, gamma, beta, running_mean,
// running_var}: {y, save_mean, save_invstd, used_batch_stats}. Throws qg::Error naming the
// op on a bad rank, dtype or vector length (the pass builds the node without apply()).
std::vector<TensorType> fused_channel_div_batch_norm_types(const std::vector<TensorType>& in);

// Output types of fused_channel_div_batch_norm_backward for inputs {dy, x, s, gamma,
// save_mean, save_invstd, used_batch_stats}: {dx, ds, dgamma, dbeta}. Throws like the above.
std::vector<TensorType> fused_channel_div_batch_norm_backward_types(
    const std::vector<TensorType>& in);

// Registers both ops (called by define_fused_ops).
void define_fused_channel_div_bn_ops(OpRegistry& r);

}  // namespace qg
