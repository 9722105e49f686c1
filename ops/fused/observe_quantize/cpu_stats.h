// Batch statistics for the CPU fused observer + quantizer (cpu_kernel.cpp),
// kept apart from the driver so each file stays small. Every function here computes, over
// the finite values it reads (after the exact widening of bf16/f16 to f32), what the
// observer kernels' per-element obsmath::ordered_min / ordered_max loop computes, and counts
// the non-finite values, so fused statistics equal unfused ones bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/float_order.h"
#include "core/half.h"

namespace qg::fused_cpu {

// Ranges are kept as order keys (core/float_order.h): min/max of keys are ordered_min /
// ordered_max of the floats.
// Per-qparams ranges of this batch, as keys: +inf / -inf (an empty range) until a finite
// value arrives.
struct Ranges {
  std::vector<int32_t> lo, hi;
  int64_t nonfinite = 0;
  explicit Ranges(int64_t n);
  float min(int64_t q) const { return key_float(lo[q]); }
  float max(int64_t q) const { return key_float(hi[q]); }
};

// Folds `local` (the ranges of qparams base .. base + local.lo.size() - 1) and its
// non-finite count into `shared` with atomic min/max/add: parallel tasks merge in any order
// and leave the same keys.
void merge_ranges(const Ranges& local, int64_t base, Ranges& shared);

// Folds n contiguous values into the range of qparams index q.
void run_stats(const float* x, int64_t n, int64_t q, Ranges& r);
void run_stats(const bf16* x, int64_t n, int64_t q, Ranges& r);
void run_stats(const f16* x, int64_t n, int64_t q, Ranges& r);

// Folds `rows` contiguous rows of `width` values, element j of a row going into the range
// of qparams index q0 + j (per channel on the last axis, per group across an inner extent).
void lane_stats(const float* x, int64_t rows, int64_t width, int64_t q0, Ranges& r);
void lane_stats(const bf16* x, int64_t rows, int64_t width, int64_t q0, Ranges& r);
void lane_stats(const f16* x, int64_t rows, int64_t width, int64_t q0, Ranges& r);

}  // namespace qg::fused_cpu
