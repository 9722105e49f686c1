// The quantize (s8/u8 codes) loops of the CPU fused observer + quantizer, kept apart from
// the driver (cpu_kernel.cpp) so each file stays small. Each element is
// qstore::quantize<float> of the unfused quantize kernel (bf16/f16 widened exactly to f32
// first), so codes and mask bits are identical to it. Mask contract as in
// fake_quantize_simd.h: bits first .. first + n - 1 are written and must be 0 on entry.
#pragma once

#include <cstdint>

#include "core/half.h"
#include "ops/fake_quantize/fake_quantize_simd.h"

namespace qg::fused_cpu {

// n contiguous elements sharing one set of qparams (zero_point holds the integer zp).
template <typename T, typename Q>
void code_run(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t n,
              const fq_simd::RunQParams& p);

// n contiguous elements, element j using qparams j of the arrays.
template <typename T, typename Q>
void code_lanes(const T* x, Q* q, uint8_t* mask, int64_t first, int64_t n,
                const fq_simd::LaneQParams& p);

}  // namespace qg::fused_cpu
