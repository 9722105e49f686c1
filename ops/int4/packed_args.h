// The parsed arguments of the 4-bit packing ops (INT4 and NF4) and of NF4's 8-bit double
// quantization, shared by their CPU and CUDA kernels.
#pragma once

#include <cstdint>
#include <memory>

#include "core/kernel_args.h"
#include "ops/common/quant_scope.h"

namespace qg {

struct PackedArgs : KernelArgs {
  // The groups over the logical shape: x's for the pack ops, attribute `shape` (the
  // output's) for the unpack ops.
  ScopeLayout layout;
  bool symmetric = false;   // int4_quantize_pack: mode = symmetric
  bool high_first = false;  // nibble_order = high_first
};
std::shared_ptr<const KernelArgs> parse_packed_args(const ArgsSource& source);

struct BlockArgs : KernelArgs {
  int64_t block_size = 0;  // values per 8-bit block
};
std::shared_ptr<const KernelArgs> parse_block_args(const ArgsSource& source);

}  // namespace qg
