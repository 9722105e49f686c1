// The fused observer + quantizer op (see fused_observe_quantize_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Ops the fusion pass may combine: an observer producing (scale, zero_point) from x, and a
// quantizer consuming (x, scale, zero_point) and producing (y, mask).
const std::vector<std::string>& fusible_observers();
const std::vector<std::string>& fusible_quantizers();

// Runs the kernel of `original` (one of a fused node's fused_from nodes) for `dtype` on
// `device` with the given tensors, the fused node's training flag and stream; returns its
// outputs. `fused_op` names the fused op in the error when no such kernel exists.
std::vector<Tensor> run_original_kernel(const std::string& fused_op, const Node& original,
                                        DeviceType device, DType dtype, std::vector<Tensor> inputs,
                                        std::vector<Tensor> outputs, std::vector<Tensor>& states,
                                        const KernelContext& fused);

// The activation (relu, gelu or silu) that the fuse_activation_prologue pass moved into a
// fused_observe_quantize node, applied to x before the observer; null when none.
const Node* prologue_activation(const Node& fused);
const std::vector<std::string>& prologue_activations();

// Replaces ctx.inputs[0] by the node's prologue activation of it (the activation's own
// kernel into a temporary on `device`); nothing when the node has none.
void apply_prologue(KernelContext& ctx, DeviceType device);

// Runs the two original kernels of a fused node back to back on `device`.
void run_fused_observe_quantize_composed(KernelContext& ctx, DeviceType device);

// The CPU kernel: one loop nest per row or tile for f32/bf16/f16, else the composed one.
void fused_observe_quantize_cpu(KernelContext& ctx);

// Launches, since the process started, of the CUDA kernel for channels on a middle axis, by
// how it maps threads to channels (ops/fused/fused_cooperative_middle.cuh): whole rows of the
// outer axis per grid sweep, or channel-major. Tests read them to check that a shape reaches
// the kernel it is meant to cover; the CUDA launcher adds to them.
struct MiddleMapLaunches {
  int64_t rows = 0, channels = 0;
};
MiddleMapLaunches fused_middle_map_launches();
void count_fused_middle_map_launch(bool channel_major);

}  // namespace qg
