// The fuse_dfq_cast rule (dfq_cast_fusion.cpp), registered on dynamic_fake_quantize itself:
// the fused node is the same op with attribute out_dtype.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses dynamic_fake_quantize (f32 x) -> y -> cast to bf16/f16 into one
// dynamic_fake_quantize with out_dtype: the weight of a mixed-precision GEMM, fake-quantized
// and cast in one pass.
FusionRule dfq_cast_fusion_rule();

// Why `cast`'s input may not be fused into it; empty when it may.
std::string dfq_cast_fusion_blocker(const Graph& graph, NodeId cast);

}  // namespace qg
