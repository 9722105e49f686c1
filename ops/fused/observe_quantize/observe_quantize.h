// The fused observer + quantizer op (see observe_quantize_op.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_math.h"
#include "ops/common/quant_scope.h"

namespace qg {

// Ops the fusion pass may combine: an observer producing (scale, zero_point) from x, and a
// quantizer consuming (x, scale, zero_point) and producing (y, mask).
const std::vector<std::string>& fusible_observers();
const std::vector<std::string>& fusible_quantizers();

// What the kernels read of the observer and quantizer they fuse, parsed once from the
// node's parts: the observer's kind and qparam settings, the quantizer's range and what it
// outputs, and the scope laid out over x.
struct ObserveQuantizeArgs : KernelArgs {
  bool moving_average = false;
  bool delayed = false;  // qparams from the previous step's statistics
  float averaging_constant = 0.0f;
  qmath::QParamsConfig cfg;
  QuantRange range;
  bool codes = false;  // the quantizer is `quantize` (integer codes), not `fake_quantize`
  ScopeLayout layout;
};

// The activation (relu, gelu or silu) that the fuse_activation_prologue pass moved into a
// fused_observe_quantize node, applied to x before the observer; null when none.
const Node* prologue_activation(const Node& fused);
const KernelPart* prologue_activation(const PreparedArgs& fused);  // the same, for kernels
const std::vector<std::string>& prologue_activations();

// Replaces ctx.inputs[0] by the node's prologue activation of it (the activation's own
// kernel into a temporary on `device`); nothing when the node has none.
void apply_prologue(KernelContext& ctx, DeviceType device);

// Runs the two original kernels of a fused node back to back on `device`.
void run_fused_observe_quantize_composed(KernelContext& ctx, DeviceType device);

// The CPU kernel: one loop nest per row or tile for f32/bf16/f16, else the composed one.
void fused_observe_quantize_cpu(KernelContext& ctx);

// Registers fused_observe_quantize with its fusion rules (called by define_fused_ops).
void define_fused_observe_quantize_op(OpRegistry& r);

}  // namespace qg
