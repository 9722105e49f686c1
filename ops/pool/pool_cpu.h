// CPU kernels of the pooling ops (ops/pool/pool_ops.cpp declares the ops).
#pragma once

#include "core/op_schema.h"

namespace qg::cpu {

void max_pool2d(KernelContext& ctx);
void max_pool2d_backward(KernelContext& ctx);
void avg_pool2d(KernelContext& ctx);
void avg_pool2d_backward(KernelContext& ctx);
void global_avg_pool2d(KernelContext& ctx);
void global_avg_pool2d_backward(KernelContext& ctx);

}  // namespace qg::cpu
