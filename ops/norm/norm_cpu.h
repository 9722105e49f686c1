// CPU kernels of batch_norm and layer_norm (the reference the CUDA kernels are checked
// against). Statistics are sums and sums of squares accumulated in f64 for every input
// dtype, var = E[x^2] - E[x]^2 clamped at 0 (the CUDA kernels form the same sums, in another
// order); the per-element math runs in the math type of the dtype.
#pragma once

#include "core/op_schema.h"

namespace qg::norm {

// x [N, C, rest...] seen as [N, C, S], S = product of the trailing dimensions.
struct ChannelLayout {
  int64_t n = 0, c = 0, s = 0;
};
ChannelLayout channel_layout(const Shape& x);

// batch_norm: true when this run normalises with batch statistics (training and not frozen).
bool uses_batch_statistics(const KernelContext& ctx);

void batch_norm_cpu(KernelContext& ctx);
void batch_norm_backward_cpu(KernelContext& ctx);
void layer_norm_cpu(KernelContext& ctx);
void layer_norm_backward_cpu(KernelContext& ctx);

}  // namespace qg::norm
