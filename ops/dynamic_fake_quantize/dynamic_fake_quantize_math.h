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
//   float_zero: torchao's asymmetric qparams with the zero point a float (its
//               ZeroPointDomain.FLOAT, tinygemm's int4 format; its int4 weight-only QAT):
//               mn, mx = min(x), max(x) (0 not included)
//               scale = T(T(mx - mn) * (1 / (qmax - qmin))), at least T(eps)
//               zero = T(mn + T(scale * mid)), mid = (qmin + qmax + 1) / 2, from the scale
//               before it is stored; then both rounded to the qparam dtype S (torchao's
//               scale_precision, bf16 for its int4 weight-only QAT).
// A NaN or an infinity in the group makes the scale non-finite: the kernels report a bad
// scale (torchao returns NaN there).
//
// The float-zero element math (fake_quant_float_zero) follows torchao's tinygemm quantize and
// dequantize, P being the dtype torch promotes T and S to:
//   low = S(zero - S(scale * mid))
//   q = clamp(rint(P(P(x - low) / scale)), qmin, qmax)   (in range: before the clamp)
//   y = T(T(T(q - mid) * scale) + zero)
#pragma once

#include "core/half_bits.h"
#include "ops/common/quant_math.h"

namespace qg::dfq {

enum class Rounding : int32_t { none, f16, bf16 };
enum class Mode : int32_t { asymmetric, symmetric, float_zero };

struct Config {
  int32_t qmin = -128, qmax = 127;
  Mode mode = Mode::asymmetric;
  double eps = 1.1920928955078125e-07;  // the scale's floor, compared in the math type
  double inv_range = 1.0 / 255.0;       // 1 / (qmax - qmin), or 1 / ((qmax - qmin) / 2)
  Rounding rounding = Rounding::none;   // T, the input's dtype
  // float_zero only: S, the dtype the scale and zero are stored in (T's rounding when they
  // stay in T), P, the dtype torch computes x - low and its quotient in, and mid.
  Rounding qparam_rounding = Rounding::none;
  Rounding promoted_rounding = Rounding::none;
  double mid = 8.0;
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
  M scale;       // in T's values (S's for float_zero); finite and > 0 unless the group held a
                 // NaN or an infinity
  M zero_point;  // an integer in [qmin, qmax]; float_zero: a value of S
  bool valid;    // scale finite and > 0 (and, for float_zero, the zero finite)
  M low = M(0);  // float_zero: the value code 0 stands for, S(zero - S(scale * mid))
};

// float_zero's low, from the stored scale and zero (values of S).
template <typename M>
QG_HD M float_zero_low(M scale, M zero, const Config& c) {
  const M shift = round_to(scale * static_cast<M>(c.mid), c.qparam_rounding);
  return round_to(zero - shift, c.qparam_rounding);
}

template <typename M>
QG_HD QParams<M> float_zero_qparams(M mn, M mx, const Config& c) {
  M scale = round_to(mx - mn, c.rounding);
  scale = round_to(scale * static_cast<M>(c.inv_range), c.rounding);
  const M eps = static_cast<M>(c.eps);
  if (!qmath::is_nan(scale) && scale < eps) scale = round_to(eps, c.rounding);
  M zero = round_to(mn + round_to(scale * static_cast<M>(c.mid), c.rounding), c.rounding);
  scale = round_to(scale, c.qparam_rounding);
  zero = round_to(zero, c.qparam_rounding);
  const bool valid = qmath::is_finite(scale) && scale > M(0) && qmath::is_finite(zero);
  return {scale, zero, valid, valid ? float_zero_low(scale, zero, c) : M(0)};
}

// The qparams of a group whose minimum and maximum (values of T) are mn and mx.
template <typename M>
QG_HD QParams<M> qparams(M mn, M mx, const Config& c) {
  if (c.mode == Mode::float_zero) return float_zero_qparams(mn, mx, c);
  const bool symmetric = c.mode == Mode::symmetric;
  const M min_neg = min_with_zero(mn), max_pos = max_with_zero(mx);
  const M inv_range = static_cast<M>(c.inv_range), eps = static_cast<M>(c.eps);
  M scale;
  if (symmetric) {
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
  if (!symmetric && valid) {
    const M r = round_to(qmath::round_even(round_to(min_neg / scale, c.rounding)), c.rounding);
    zp = round_to(static_cast<M>(c.qmin) - r, c.rounding);
    zp = qmath::clamp(zp, static_cast<M>(c.qmin), static_cast<M>(c.qmax));
  }
  return {scale, zp, valid};
}

// One element of float_zero (see the top): y in the math type (rounded to T) and whether
// the code was in range before the clamp.
template <typename M>
QG_HD qmath::FakeQuantResult<M> fake_quant_float_zero(M x, const QParams<M>& p, M qmin, M qmax,
                                                      const Config& c) {
  if (qmath::is_nan(x)) return {x, false};
  const M u = round_to(round_to(x - p.low, c.promoted_rounding) / p.scale, c.promoted_rounding);
  const M r = qmath::round_even(u);
  const bool in_range = (r >= qmin) && (r <= qmax);
  M y = round_to(qmath::clamp(r, qmin, qmax) - static_cast<M>(c.mid), c.rounding);
  y = round_to(y * p.scale, c.rounding);
  return {round_to(y + p.zero_point, c.rounding), in_range};
}

// One element in the mode the kernel was instantiated for (inv = 1 / scale, integer modes).
template <bool kFloatZero, typename M>
QG_HD qmath::FakeQuantResult<M> fake_quant_element(M x, const QParams<M>& p, M inv, M qmin, M qmax,
                                                   const Config& c) {
  if constexpr (kFloatZero) {
    return fake_quant_float_zero(x, p, qmin, qmax, c);
  } else {
    return qmath::fake_quant(x, inv, p.scale, p.zero_point, qmin, qmax);
  }
}

}  // namespace qg::dfq
