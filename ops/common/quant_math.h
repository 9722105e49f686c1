// Element-level quantization math shared verbatim by the CPU and CUDA kernels, so the two
// backends compute the same operations in the same order (bit-identical in f32). Keep this
// header free of Eigen and of the standard library beyond <cmath>.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define QG_HD __host__ __device__ __forceinline__
#else
#define QG_HD inline
#endif

namespace qg::qmath {

QG_HD float round_even(float v) {
  return rintf(v);
}
QG_HD double round_even(double v) {
  return rint(v);
}
QG_HD bool is_nan(float v) {
  return v != v;
}
QG_HD bool is_nan(double v) {
  return v != v;
}
QG_HD bool is_finite(float v) {
  return v == v && v - v == 0.0f;
}
QG_HD bool is_finite(double v) {
  return v == v && v - v == 0.0;
}

template <typename M>
QG_HD M clamp(M v, M lo, M hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// One fake-quantized element (SEMANTICS.md, "Fake quantize"): q = rint(x * inv) + zp,
// y = (clamp(q) - zp) * scale, in range iff qmin <= q <= qmax. NaN stays NaN (mask 0);
// +/-Inf clamp to the end values (mask 0).
template <typename M>
struct FakeQuantResult {
  M y;
  bool in_range;
};

template <typename M>
QG_HD FakeQuantResult<M> fake_quant(M x, M inv_scale, M scale, M zp, M qmin, M qmax) {
  if (is_nan(x)) return {x, false};
  M q = round_even(x * inv_scale) + zp;
  bool in_range = (q >= qmin) && (q <= qmax);
  M y = (clamp(q, qmin, qmax) - zp) * scale;
  return {y, in_range};
}

// Integer code for quantize-to-storage: clamp(rint(x * inv) + zp, qmin, qmax); NaN -> zp.
template <typename M>
QG_HD int32_t quantize_code(M x, M inv_scale, M zp, M qmin, M qmax) {
  if (is_nan(x)) return static_cast<int32_t>(zp);
  M q = round_even(x * inv_scale) + zp;
  return static_cast<int32_t>(clamp(q, qmin, qmax));
}

// Quantization parameters from an observed (min, max), PyTorch's _calculate_qparams in f32.
struct QParamsConfig {
  int32_t qmin = 0;
  int32_t qmax = 255;
  bool symmetric = false;
  bool denominator_qmax = false;  // symmetric_denominator = "qmax": scale = amax / qmax
  int32_t symmetric_zero_point = 128;
  float eps = 1.1920928955078125e-07f;
};

struct QParams {
  float scale;
  int32_t zero_point;
};

QG_HD QParams qparams_from_range(float min_v, float max_v, bool any_finite,
                                 const QParamsConfig& c) {
  if (!any_finite) return {1.0f, 0};
  float min_neg = min_v < 0.0f ? min_v : 0.0f;
  float max_pos = max_v > 0.0f ? max_v : 0.0f;
  if (c.symmetric) {
    float amax = -min_neg > max_pos ? -min_neg : max_pos;
    float denom = c.denominator_qmax ? static_cast<float>(c.qmax)
                                     : static_cast<float>(c.qmax - c.qmin) / 2.0f;
    float scale = amax / denom;
    scale = scale > c.eps ? scale : c.eps;
    return {scale, c.symmetric_zero_point};
  }
  float scale = (max_pos - min_neg) / static_cast<float>(c.qmax - c.qmin);
  scale = scale > c.eps ? scale : c.eps;
  float zp = static_cast<float>(c.qmin) - round_even(min_neg / scale);
  zp = clamp(zp, static_cast<float>(c.qmin), static_cast<float>(c.qmax));
  return {scale, static_cast<int32_t>(zp)};
}

}  // namespace qg::qmath
