// The qparams of dynamic_fake_quantize, shared by the CPU and CUDA kernels: torchao's QAT
// qparams (its 8da4w per-token activations and per-group weights) as PyTorch's CUDA kernels
// compute them on a tensor of dtype T. Each torch op of that computation works in T's math
// type (f32 for f16/bf16) and rounds its result to T once, so every step below rounds to T
// (`Rounding`); a division by a Python number is a multiplication by its reciprocal, as
// PyTorch's CUDA division by a CPU scalar computes it.
//
//   asymmetric: min_neg = min(min(x), 0), max_pos = max(max(x), 0)
//               scale = T(T(max_pos - min_neg) * (1 / (qmax - qmin))), at least T(eps)
//               zp = clamp(T(qmin - T(rint(T(min_neg / scale)))), qmin, qmax)
//   symmetric:  scale = T(max(-min_neg, max_pos) * (1 / ((qmax - qmin) / 2))), at least
//               T(eps); zp = 0
// A NaN or an infinity in the group makes the scale non-finite: the kernels report a bad
// scale (torchao returns NaN there).
#pragma once

#include "core/half_bits.h"
#include "ops/common/quant_math.h"

namespace qg::dfq {

enum class Rounding : int32_t { none, f16, bf16 };

struct Config {
  int32_t qmin = -128, qmax = 127;
  bool symmetric = false;
  double eps = 1.1920928955078125e-07;  // the scale's floor, compared in the math type
  double inv_range = 1.0 / 255.0;       // 1 / (qmax - qmin), or 1 / ((qmax - qmin) / 2)
  Rounding rounding = Rounding::none;
};

// v rounded to T (nearest even) and widened back to the math type M.
template <typename M>
QG_HD M round_to(M v, Rounding r) {
  const float f = static_cast<float>(v);
  if (r == Rounding::bf16) return static_cast<M>(half_bits::bf16_to_f32(half_bits::f32_to_bf16(f)));
  if (r == Rounding::f16) return static_cast<M>(half_bits::f16_to_f32(half_bits::f32_to_f16(f)));
  return v;
}

// torch.minimum / maximum against 0: NaN propagates, and a zero result is +0.
template <typename M>
QG_HD M min_with_zero(M v) {
  return qmath::is_nan(v) ? v : (v < M(0) ? v : M(0));
}
template <typename M>
QG_HD M max_with_zero(M v) {
  return qmath::is_nan(v) ? v : (v > M(0) ? v : M(0));
}

template <typename M>
struct QParams {
  M scale;       // in T's values; finite and > 0 unless the group held a NaN or an infinity
  M zero_point;  // an integer in [qmin, qmax]
  bool valid;    // scale finite and > 0
};

// The qparams of a group whose minimum and maximum (values of T) are mn and mx.
template <typename M>
QG_HD QParams<M> qparams(M mn, M mx, const Config& c) {
  const M min_neg = min_with_zero(mn), max_pos = max_with_zero(mx);
  const M inv_range = static_cast<M>(c.inv_range), eps = static_cast<M>(c.eps);
  M scale;
  if (c.symmetric) {
    const M neg = -min_neg;
    const M amax = qmath::is_nan(neg) || qmath::is_nan(max_pos) ? neg + max_pos
                                                                : (neg > max_pos ? neg : max_pos);
    scale = round_to(amax * inv_range, c.rounding);
  } else {
    scale = round_to(max_pos - min_neg, c.rounding);
    scale = round_to(scale * inv_range, c.rounding);
  }
  // torch.clamp(min=eps): NaN stays; below eps the result is eps rounded to T.
  if (!qmath::is_nan(scale) && scale < eps) scale = round_to(eps, c.rounding);
  const bool valid = qmath::is_finite(scale) && scale > M(0);
  M zp = M(0);
  if (!c.symmetric && valid) {
    const M r = round_to(qmath::round_even(round_to(min_neg / scale, c.rounding)), c.rounding);
    zp = round_to(static_cast<M>(c.qmin) - r, c.rounding);
    zp = qmath::clamp(zp, static_cast<M>(c.qmin), static_cast<M>(c.qmax));
  }
  return {scale, zp, valid};
}

}  // namespace qg::dfq
