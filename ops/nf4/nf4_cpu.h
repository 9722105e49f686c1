// CPU kernels of the NF4 family (declared in nf4_op.cpp).
#pragma once

#include "core/op_schema.h"

namespace qg {

void nf4_quantize_pack_cpu(KernelContext& ctx);
void nf4_unpack_dequantize_cpu(KernelContext& ctx);
void nf4_double_quantize_cpu(KernelContext& ctx);
void nf4_double_dequantize_cpu(KernelContext& ctx);

}  // namespace qg
