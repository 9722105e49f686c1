// Walks a quantization scope as runs of consecutive elements whose qparams index is either
// constant (step 0) or advances by one per element (step 1), so CPU kernels hoist the
// qparams out of their inner loop instead of recomputing the index per element; for the
// per-tensor scope, where the [outer, axis, inner] view has axis = inner = 1, a triple loop
// would otherwise spend most of its time in loop overhead.
#pragma once

#include <algorithm>

#include "ops/common/quant_scope.h"

#if defined(__GNUC__)
#define QG_ELEMENT __attribute__((always_inline))
#else
#define QG_ELEMENT
#endif

namespace qg {

// fn(first element, run length, qparams index of the first element, index step).
template <typename Fn>
void for_each_scope_run(const ScopeLayout& l, Fn&& fn) {
  const int64_t row = l.axis_len * l.inner;
  switch (l.kind) {
    case ScopeKind::tensor:
      if (l.outer * row > 0) fn(int64_t{0}, l.outer * row, int64_t{0}, int64_t{0});
      return;
    case ScopeKind::token:  // the last axis: one qparams index per row
      for (int64_t o = 0; o < l.outer; ++o) fn(o * row, row, o, int64_t{0});
      return;
    case ScopeKind::channel:
      if (l.inner == 1) {
        for (int64_t o = 0; o < l.outer; ++o) fn(o * row, l.axis_len, int64_t{0}, int64_t{1});
      } else {
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t a = 0; a < l.axis_len; ++a)
            fn(o * row + a * l.inner, l.inner, a, int64_t{0});
      }
      return;
    case ScopeKind::group:
      if (l.inner == 1) {
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t g = 0; g < l.num_groups; ++g) {
            int64_t start = g * l.group_size;
            fn(o * row + start, std::min(l.group_size, l.axis_len - start), o * l.num_groups + g,
               int64_t{0});
          }
      } else {
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t a = 0; a < l.axis_len; ++a)
            fn(o * row + a * l.inner, l.inner, (o * l.num_groups + a / l.group_size) * l.inner,
               int64_t{1});
      }
      return;
  }
}

// Calls fn(k, qparams index) for every element in order. Kernels mark the per-element lambda
// QG_ELEMENT so it is inlined into both loops below (GCC otherwise calls it per element).
template <typename Fn>
void for_each_scoped(const ScopeLayout& l, Fn&& fn) {
  for_each_scope_run(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
    if (step == 0) {
      for (int64_t j = 0; j < len; ++j) fn(k0 + j, q0);
    } else {
      for (int64_t j = 0; j < len; ++j) fn(k0 + j, q0 + j);
    }
  });
}

}  // namespace qg
