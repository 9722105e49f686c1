// The arithmetic of int8_matmul, shared by the CPU reference and the CUDA kernel
// (int8_gemm_cuda.cu follows the same steps; the crosscheck compares them bit for bit).
//
// y[m, n] for activation codes a [M, K] (per-row scale sa, zero point za) and weight codes
// w [N, K] (symmetric, one scale sw per group of G consecutive k of a row; G = K is per
// channel):
//   acc = 0 (f32)
//   for each group g in increasing k:
//     p   = sum over k in g of (a[m, k] - za[m]) * w[n, k]      exact, in int32
//     acc = fma(f32(p), sw[n, g], acc)                           one rounding
//   y = out_dtype(acc * sa[m])                                   two roundings (f32, then out)
//
// Why this order: each group's integer dot product is exact (|p| <= G * 255 * 128 < 2^31 for
// G <= 65536, and za within [-128, 127]), so the only roundings are the group's conversion
// and fused multiply-add and the final scale, in an order a GPU tile can keep while it walks K.
// The product is the deployed model's arithmetic itself: the QAT forward (int8_matmul_ste) and
// the converted model (int8_matmul) both run it, so they agree bit for bit on every backend.
// It differs from the fake-quant float GEMM (which rounds the dequantized operands to the
// compute dtype and sums the products in another order) by float rounding only.
#pragma once

#include <cstdint>

namespace qg::int8mm {

// The largest group whose exact sum is guaranteed to fit int32: 65536 * 255 * 128 < 2^31.
constexpr int64_t kMaxGroup = 65536;

// One output's f32 result before the narrowing to the output dtype (the CPU reference).
// `u` holds a[m, :] - za[m] (within [-255, 255]); `w` is row n of the weight codes, widened;
// `sw` its group scales. Both as int16 so that the compiler's vectorised dot product
// multiplies 16-bit pairs into 32-bit sums (pmaddwd), still exactly.
inline float dot_row(const int16_t* u, const int16_t* w, const float* sw, int64_t k, int64_t group,
                     float sa) {
  float acc = 0.0f;
  for (int64_t g0 = 0, gi = 0; g0 < k; g0 += group, ++gi) {
    int32_t p = 0;
    for (int64_t j = g0; j < g0 + group; ++j)
      p += static_cast<int32_t>(u[j]) * static_cast<int32_t>(w[j]);
    acc = __builtin_fmaf(static_cast<float>(p), sw[gi], acc);
  }
  return acc * sa;
}

}  // namespace qg::int8mm
