// The arithmetic of rms_norm that the CPU and CUDA kernels share, so that both give the same
// bits. T is the storage dtype, M its math type (f32 for f16/bf16/f32, f64 for f64).
//
//   forward:  ss    = sum of x_j^2 over the row, in f64 (in kLanes order, below)
//             rstd  = 1 / sqrt(M(ss / d) + M(eps))         (IEEE sqrt and division in M)
//             h_j   = T(x_j * rstd)                          transformers' cast back to x's dtype
//             y_j   = T(w_j * h_j)
//   backward: g_j   = T(dy_j * w_j)                          torch's product in x's dtype
//             s     = sum of g_j * x_j over the row, in f64 (kLanes order)
//             dx_j  = T(rstd * g_j - x_j * (M(s / d) * rstd^3))
//             dw_j  = sum over rows of dy_j * h_j, in f64: rows in chunks of kRowsPerChunk
//                     (each summed in row order), the chunk sums then added in chunk order
// The order of every f64 sum is part of the definition: lane t of kLanes sums elements
// t, t + kLanes, ... in order, and the lane sums meet in a halving tree (lane t adds lane
// t + half for half = 16, 8, 4, 2, 1), which is what a warp computes with xor shuffles. The
// CPU kernel emulates it, so the two backends agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace qg::rms_norm_math {

constexpr int kLanes = 32;
constexpr int64_t kRowsPerChunk = 32;

QG_HOST_DEVICE float sqrt_in(float v) {
  return sqrtf(v);
}
QG_HOST_DEVICE double sqrt_in(double v) {
  return sqrt(v);
}

// 1 / sqrt(mean + eps) for a row of `dim` elements whose squares sum to `ss`.
template <typename M>
QG_HOST_DEVICE M inv_rms(double ss, int64_t dim, double eps) {
  const M mean = static_cast<M>(ss / static_cast<double>(dim));
  return M(1) / sqrt_in(mean + static_cast<M>(eps));
}

// The factor of x_j in dx_j: (s / d) * rstd^3, multiplied left to right in M.
template <typename M>
QG_HOST_DEVICE M dx_factor(double s, int64_t dim, M rstd) {
  return static_cast<M>(s / static_cast<double>(dim)) * rstd * rstd * rstd;
}

// The halving tree over kLanes lane sums (p is overwritten).
QG_HOST_DEVICE double lane_tree(double* p) {
  for (int half = kLanes / 2; half > 0; half /= 2)
    for (int t = 0; t < half; ++t) p[t] = p[t] + p[t + half];
  return p[0];
}

}  // namespace qg::rms_norm_math
