// Where the rows of the causal attention ops' inputs lie. A direct call may hand the kernels
// views (q, k and v sliced out of one fused QKV projection, a [batch, seq, heads, head_dim]
// tensor permuted to [batch, heads, seq, head_dim]) instead of contiguous tensors: any
// non-negative strides on the batch, head and seq axes, stride 1 on head_dim. The strides
// belong to the tensors of one call, not to the call site, so the kernels read them at call
// time (attention_strides) beside the layout parsed once (AttentionArgs). Outputs are always
// contiguous.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/op_schema.h"

namespace qg {

// Row (n, h, i) of a [batch, heads, seq, head_dim] input (or element (n, h, i) of lse
// [batch, heads, seq]) starts `at(n, h, i)` elements past the tensor's first one.
struct RowStrides {
  int64_t batch = 0, head = 0, seq = 0;
  QG_HOST_DEVICE int64_t at(int64_t n, int64_t h, int64_t i) const {
    return n * batch + h * head + i * seq;
  }
};

// One per input of causal_attention_backward in its order (q, k, v, o, lse, do); the forward
// fills q, k and v only.
struct AttentionStrides {
  RowStrides q, k, v, o, lse, dout;
};

// The strides of ctx's inputs (a stride of a size-1 axis reads as 0: it is never stepped).
// qg::Error naming the op, the input and its strides when the head_dim axis of q, k, v, o
// or do is not contiguous.
AttentionStrides attention_strides(const KernelContext& ctx);

}  // namespace qg
