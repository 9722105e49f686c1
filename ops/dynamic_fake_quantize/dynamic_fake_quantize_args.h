// The parsed arguments of dynamic_fake_quantize: its groups along the last axis and the qparam
// configuration (dynamic_fake_quantize_math.h), read once per call site.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernel_args.h"
#include "ops/dynamic_fake_quantize/dynamic_fake_quantize_math.h"

namespace qg {

struct DynamicFakeQuantizeArgs : KernelArgs {
  int64_t groups = 0;      // numel / group_len: one (scale, zero point) each
  int64_t group_len = 1;   // the group size, or the whole last axis
  dfq::Config config;      // rounding set from the input's dtype
  DType out = DType::f32;  // y's dtype: x's, or (attribute out_dtype) bf16/f16 from an f32 x
};

}  // namespace qg
