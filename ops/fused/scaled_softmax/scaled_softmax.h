// The fused scale + softmax ops (see scaled_softmax_op.cpp).
#pragma once

#include "core/op_registry.h"

namespace qg {

// Throws qg::Error naming the op when a fused node's inputs do not fit it (fused_from, input
// count, dtypes and shapes, a scale of more than one element). Every kernel calls it first:
// the pass builds valid nodes, this guards hand-built ones.
void check_fused_scaled_softmax_inputs(const KernelContext& ctx);

// Runs a fused node's original kernels back to back on `device` (the CPU kernels, and the
// CUDA kernels' fallback for the layouts their single pass does not cover):
// fused_scaled_softmax: mul then softmax; fused_scaled_softmax_backward: softmax_backward
// then mul. Bit-identical to the unfused nodes by construction.
void run_scaled_softmax_composed(KernelContext& ctx, DeviceType device);
void run_scaled_softmax_backward_composed(KernelContext& ctx, DeviceType device);

// Registers fused_scaled_softmax and fused_scaled_softmax_backward (called by
// define_fused_ops).
void define_fused_scaled_softmax_ops(OpRegistry& r);

}  // namespace qg
