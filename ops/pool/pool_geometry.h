// Pooling windows (NCHW), shared verbatim by the CPU and CUDA kernels so both visit the same
// cells in the same order (bit-identical results in f32). The rules are PyTorch's:
//   output size  = floor((in + 2 pad - dil (k - 1) - 1 + (ceil ? stride - 1 : 0)) / stride) + 1,
//                  minus one in ceil mode when the last window would start at or past
//                  in + pad (it must start inside the input or the left padding);
//   max windows  cover rows start, start + dil, ... clipped to the input (padding is -inf);
//   avg divisor  = the window's cells inside input + padding (count_include_pad), or inside
//                  the input only; a window clipped at the right padding in ceil mode counts
//                  only up to in + pad.
// Keep this header free of Eigen and of the standard library beyond <cstdint>.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QG_POOL_HD __host__ __device__ __forceinline__
#else
#define QG_POOL_HD inline
#endif

namespace qg::pool {

// Global average pooling sums each plane in kPlaneSumLanes interleaved partial sums (partial
// j takes elements j, j + 32, ... in order), then folds them pairwise (j += j + 16, then
// j += j + 8, ..., 1): the order of one warp per plane reading coalesced and reducing with
// shuffles on the GPU, and of the CPU loop, so the two agree bit for bit.
constexpr int kPlaneSumLanes = 32;

struct PoolGeom {
  int64_t planes = 0;  // N * C
  int64_t H = 0, W = 0, OH = 0, OW = 0;
  int64_t kH = 1, kW = 1, sH = 1, sW = 1, pH = 0, pW = 0, dH = 1, dW = 1;
  bool count_include_pad = true;
};

// In-bounds rows [h0, h1) and columns [w0, w1) of a window, stepping by the dilation.
struct Window {
  int64_t h0, h1, w0, w1;
};

QG_POOL_HD int64_t min_i(int64_t a, int64_t b) {
  return a < b ? a : b;
}
QG_POOL_HD int64_t max_i(int64_t a, int64_t b) {
  return a > b ? a : b;
}

QG_POOL_HD Window max_window(const PoolGeom& g, int64_t oh, int64_t ow) {
  Window w;
  w.h0 = oh * g.sH - g.pH;
  w.w0 = ow * g.sW - g.pW;
  w.h1 = min_i(w.h0 + (g.kH - 1) * g.dH + 1, g.H);
  w.w1 = min_i(w.w0 + (g.kW - 1) * g.dW + 1, g.W);
  while (w.h0 < 0) w.h0 += g.dH;
  while (w.w0 < 0) w.w0 += g.dW;
  return w;
}

// A max window can hold no input cell when the dilation steps past the input (e.g. width 1,
// kernel 2, dilation 2, padding 1): its output is -inf with PyTorch's index (the first cell
// it would visit, outside the window) and it passes no gradient.
QG_POOL_HD bool is_empty(const Window& w) {
  return w.h0 >= w.h1 || w.w0 >= w.w1;
}

// The window of an average and its divisor (0 for a window with no input cell).
QG_POOL_HD Window avg_window(const PoolGeom& g, int64_t oh, int64_t ow, int64_t& divisor) {
  Window w;
  w.h0 = oh * g.sH - g.pH;
  w.w0 = ow * g.sW - g.pW;
  w.h1 = min_i(w.h0 + g.kH, g.H + g.pH);
  w.w1 = min_i(w.w0 + g.kW, g.W + g.pW);
  const int64_t padded = (w.h1 - w.h0) * (w.w1 - w.w0);
  w.h0 = max_i(w.h0, 0);
  w.w0 = max_i(w.w0, 0);
  w.h1 = min_i(w.h1, g.H);
  w.w1 = min_i(w.w1, g.W);
  if (w.h0 >= w.h1 || w.w0 >= w.w1) {
    divisor = 0;
    return w;
  }
  divisor = g.count_include_pad ? padded : (w.h1 - w.h0) * (w.w1 - w.w0);
  return w;
}

// The first and last output rows (or columns) whose window can contain input row `h`:
// start + k' * dil = h for some k' in [0, k), start = o * stride - pad. The backward kernels
// gather over them in ascending order, the order the CPU's scatter adds in.
QG_POOL_HD void covering_outputs(int64_t h, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                                 int64_t out, int64_t& first, int64_t& last) {
  const int64_t lo = h + pad - (k - 1) * dil;  // smallest possible window start (+ pad)
  first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  last = min_i((h + pad) / stride, out - 1);
}

}  // namespace qg::pool
