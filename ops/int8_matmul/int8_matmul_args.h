// The parsed arguments of int8_matmul and int8_matmul_ste: the GEMM's sizes, its weight group
// and the output dtype, read once per call site by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernel_args.h"

namespace qg {

struct Int8MatmulArgs : KernelArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t group = 0;  // k's per weight scale (the attribute's 0 resolved to k)
  DType out = DType::f32;
  int codes = 0;  // where the five integer operands start: 0 (int8_matmul), 2 (_ste)
};

}  // namespace qg
