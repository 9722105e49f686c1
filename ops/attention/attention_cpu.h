// The CPU reference kernels of the causal attention ops (attention_cpu.cpp).
#pragma once

#include "core/op_schema.h"

namespace qg {

void causal_attention_cpu(KernelContext& ctx);
void causal_attention_backward_cpu(KernelContext& ctx);

}  // namespace qg
