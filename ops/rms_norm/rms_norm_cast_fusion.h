// The fuse_norm_cast rule (rms_norm_cast_fusion.cpp), registered on rms_norm: the fused node
// is rms_norm itself, with attribute out_dtype.
#pragma once

#include <string>

#include "core/fusion_rule.h"
#include "core/graph.h"

namespace qg {

// Fuses an f32 rms_norm -> [reshape views] -> cast (to bf16/f16) chain into the rms_norm with
// out_dtype and reshapes of its narrow y.
FusionRule rms_norm_cast_fusion_rule();

// Why the cast `cast` may not be fused into the rms_norm it reads (through reshape views);
// empty when it may.
std::string rms_norm_cast_fusion_blocker(const Graph& graph, NodeId cast);

}  // namespace qg
