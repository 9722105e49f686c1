// The parsed arguments of rms_norm: the row layout of x and eps, read once per call site.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernel_args.h"

namespace qg {

struct RmsNormArgs : KernelArgs {
  int64_t rows = 0;  // product of every axis but the last
  int64_t dim = 1;   // the last axis, normalised over
  double eps = 1e-6;
  DType out = DType::f32;  // y's dtype: x's, or (out_dtype) bf16/f16 from an f32 x
};

}  // namespace qg
