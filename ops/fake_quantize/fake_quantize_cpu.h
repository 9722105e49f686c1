#pragma once
#include "core/op_schema.h"
namespace qg {
void fake_quantize_cpu(KernelContext& ctx);
void ste_backward_cpu(KernelContext& ctx);
void ste_backward_exact_cpu(KernelContext& ctx);
}  // namespace qg
