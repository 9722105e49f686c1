// The multi-tensor AdamW step (see multi_tensor_adamw_op.cpp).
#pragma once

#include "core/fusion_rule.h"
#include "core/op_registry.h"

namespace qg {

// Tensors one CUDA update launch takes: their pointers travel in the kernel's parameters,
// which stay within the classic 4 KiB limit at this count.
inline constexpr int kMultiTensorChunk = 48;

// Checks the fused node's inputs against its parts (qg::Error naming the op otherwise): one
// (param, grad) pair per adamw part, each grad of its param's dtype and shape, one dtype, then
// the f64 rate and the f32 grad_scale every part read.
void check_multi_tensor_adamw_inputs(const KernelContext& ctx);

// The fuse_multi_tensor_adamw rule (multi_tensor_adamw_fusion.cpp).
FusionRule multi_tensor_adamw_fusion_rule();

// Registers fused_multi_tensor_adamw with its fusion rule (called by define_fused_ops).
void define_fused_multi_tensor_adamw_op(OpRegistry& r);

}  // namespace qg
