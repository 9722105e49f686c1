// SSE4.1 loop of the CPU lsq_backward for f32 runs of elements that share one qparam: dx
// bit for bit as lsq::element_grad gives it, and the f64 scale / zero-point terms it gives,
// summed in an order fixed by the run length. Without SSE4.1 it is the scalar loop.
#pragma once

#include <cstdint>

namespace qg::lsq_simd {

// The f32 qparams of a run (inv = 1 / scale in f32; zp_int already rounded and clamped).
struct RunQParams {
  float inv, scale, zp_int, qmin, qmax;
};

struct RunSums {
  double dscale = 0, dzp = 0;  // before grad_factor
};

// dx[j] for j < n, and the run's sums of the dscale and dzero_point terms.
RunSums backward_run(const float* x, const float* dy, float* dx, int64_t n, const RunQParams& p);

}  // namespace qg::lsq_simd
