// The parsed arguments of causal_attention and its backward: the [batch, heads, seq,
// head_dim] layout of q, the number of KV heads of k and v, and the score scale, resolved
// once per call site (the `scale` attribute, or head_dim^-1/2 when it is unset).
#pragma once

#include <cstdint>

#include "core/kernel_args.h"

namespace qg {

struct AttentionLayout {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
  double scale = 1.0;
  // Query head h reads KV head h / group (transformers' repeat_kv order).
  int64_t group() const { return heads / kv_heads; }
};

struct AttentionArgs : KernelArgs {
  AttentionLayout layout;
};

}  // namespace qg
