// Integer forward of the 8da4w / w8a8 QAT linears: y = dequant(a) * dequant(w)^T from int8
// codes on the tensor cores, bit for bit equal to this per-element contract:
//
//   acc = 0.0f
//   for g in groups of `group` consecutive k, in increasing k order:
//     p   = sum_k (a[m,k] - a_zero[m]) * w[n,k]          (exact int32)
//     acc = fmaf((float)p, w_scale[n, g], acc)            (round to nearest even, fused)
//   y[m,n] = out_type(acc * a_scale[m])                   (one f32 multiply, one rounding)
//
// The host side guarantees group % 32 == 0, k % group == 0 and group <= 65536 (so p fits in
// int32); launch() checks them again.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qg::int8_gemm {

enum class OutType { f32, bf16, f16 };

// All pointers are device pointers to contiguous row-major arrays: a [m, k], a_scale [m],
// a_zero [m], w [n, k], w_scale [n, k / group], y [m, n] of type `out`.
struct Problem {
  int64_t m, n, k, group;
  const int8_t* a;
  const float* a_scale;
  const int32_t* a_zero;
  const int8_t* w;
  const float* w_scale;
  void* y;
  OutType out;
};

// Launches on `stream` without synchronising or allocating; every CUDA call is checked, so
// failures become qg::Error naming `op`.
void launch(const Problem& p, cudaStream_t stream, const char* op);

}  // namespace qg::int8_gemm
