// x / s correctly rounded, for one divisor s reused across many x, in a few fused multiply-
// adds instead of a full IEEE division per element. Used by kernels that divide a whole
// channel by one scale (the fused channel_div + batch_norm of a folded conv-bn block), where
// the division's reciprocal iterations and its slow-path check were most of the instructions.
// The result has the bits of `x / s` for every x: the fast path is taken only where the
// argument below holds, and everything else (zeros, infinities, NaNs, tiny or huge operands,
// a tiny or huge divisor) divides.
//
// Why the fast path is exact (binary32, p = 24, no underflow or overflow in the range kept):
//  1. y = RN(1/s) and yl = RN(e * y) with e = 1 - s * y (exact in one fma) make y + yl
//     approximate 1/s within 2^-47 / |s|.
//  2. q0 = RN(x * y + RN(x * yl)) is then within half an ulp of x/s plus |x/s| * 2^-46: one of
//     the two floats around x/s (a faithful quotient).
//  3. For a faithful q0 the remainder r = x - q0 * s is exact in one fma, and
//     q1 = RN(q0 + r * y) is RN(x/s) because y's relative error is below 2^-24 (Markstein's
//     theorem). The one case that could fail, q0 on the wrong side of a midpoint M, needs
//     |x/s - M| < ulp(x/s) * 2^-25 / (1 - 2^-24). It cannot be that close: with s = S * 2^k
//     (S a 24-bit integer) and M in [2^m, 2^(m+1)), x - s * M is a non-zero multiple of
//     2^(k+m-24) (a quotient of two floats is never a midpoint), so
//     |x/s - M| >= 2^(m-24) / S >= ulp(x/s) * 2^-25 / (1 - 2^-24).
// The operand range [2^-40, 2^40] for x and s keeps x * yl, r and every product normal.
// tests/ops_norm/exact_divisor_test.cpp checks the bits against x / s at the hardest cases
// (quotients a few units of 2^-48 ulps from a midpoint) and at random ones.
#pragma once

#include <cmath>

#include "ops/common/quant_math.h"

namespace qg {

template <typename T>
struct ExactDivisor;

// f64 keeps the division: the kernels that use this are limited by f32 instruction counts.
template <>
struct ExactDivisor<double> {
  double s;
  QG_HD explicit ExactDivisor(double divisor) : s(divisor) {}
  QG_HD double operator()(double x) const { return x / s; }
};

template <>
struct ExactDivisor<float> {
  float s, y, yl;
  bool fast;

  QG_HD static bool in_fast_range(float v) {
    const float a = fabsf(v);
    return a >= 0x1p-40f && a <= 0x1p40f;  // false for NaN, zero and infinities
  }

  QG_HD explicit ExactDivisor(float divisor) : s(divisor), y(1.0f / divisor), yl(0.0f) {
    fast = in_fast_range(divisor);
    if (fast) yl = fmaf(-divisor, y, 1.0f) * y;
  }

  QG_HD float operator()(float x) const {
    if (fast && in_fast_range(x)) {
      const float q0 = fmaf(x, y, x * yl);
      const float r = fmaf(-q0, s, x);
      return fmaf(r, y, q0);
    }
    return x / s;
  }
};

}  // namespace qg
