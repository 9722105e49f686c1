// The parsed arguments of rope: the [batch, heads, seq, head_dim] layout, whether the
// position ids broadcast over the batch, the direction, and the inverse frequencies computed
// once per call site (rope_math.h), small enough to pass to a CUDA kernel by value.
#pragma once

#include <cstdint>

#include "core/kernel_args.h"

namespace qg {

// head_dim is at most 2 * kRopeMaxHalf.
constexpr int kRopeMaxHalf = 256;

struct RopeLayout {
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  bool positions_broadcast = false;  // position_ids is [1, seq]: one row for every batch
  bool inverse = false;              // rotate by -angle (the backward)
  float inv_freq[kRopeMaxHalf] = {};
};

struct RopeArgs : KernelArgs {
  RopeLayout layout;
};

}  // namespace qg
