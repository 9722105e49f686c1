// Walks a quantization scope as runs of consecutive elements whose qparams index is either
// constant (step 0) or advances by one per element (step 1), so CPU kernels hoist the
// qparams out of their inner loop instead of recomputing the index per element; for the
// per-tensor scope, where the [outer, axis, inner] view has axis = inner = 1, a triple loop
// would otherwise spend most of its time in loop overhead.
#pragma once

#include <algorithm>

#include "core/thread_pool.h"
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

// As for_each_scope_run, for the elements [begin, end) only: the runs cut at begin and end
// (a cut lane run starts at its first element's qparams index). Parallel kernels call it per
// chunk of a fixed grain, so a chunk finds its first run with a few divisions.
template <typename Fn>
void for_each_scope_run_in(const ScopeLayout& l, int64_t begin, int64_t end, Fn&& fn) {
  const int64_t row = l.axis_len * l.inner;
  if (begin >= end || row == 0) return;
  int64_t k = begin;
  switch (l.kind) {
    case ScopeKind::tensor:
      fn(begin, end - begin, int64_t{0}, int64_t{0});
      return;
    case ScopeKind::token:
      for (int64_t o = k / row; k < end; ++o) {
        const int64_t stop = std::min(end, (o + 1) * row);
        fn(k, stop - k, o, int64_t{0});
        k = stop;
      }
      return;
    case ScopeKind::channel:
      if (l.inner == 1) {
        for (int64_t o = k / row; k < end; ++o) {
          const int64_t stop = std::min(end, (o + 1) * row);
          fn(k, stop - k, k - o * row, int64_t{1});
          k = stop;
        }
      } else {
        for (int64_t s = k / l.inner, a = s % l.axis_len; k < end; ++s) {
          const int64_t stop = std::min(end, (s + 1) * l.inner);
          fn(k, stop - k, a, int64_t{0});
          k = stop;
          if (++a == l.axis_len) a = 0;
        }
      }
      return;
    case ScopeKind::group:
      if (l.inner == 1) {
        int64_t o = k / row, g = (k - o * row) / l.group_size;
        while (k < end) {
          const int64_t stop = std::min({end, o * row + (g + 1) * l.group_size, (o + 1) * row});
          fn(k, stop - k, o * l.num_groups + g, int64_t{0});
          k = stop;
          if (k == (o + 1) * row) {
            ++o;
            g = 0;
          } else {
            ++g;
          }
        }
      } else {
        for (int64_t s = k / l.inner; k < end; ++s) {
          const int64_t o = s / l.axis_len, a = s - o * l.axis_len;
          const int64_t stop = std::min(end, (s + 1) * l.inner);
          fn(k, stop - k, (o * l.num_groups + a / l.group_size) * l.inner + (k - s * l.inner),
             int64_t{1});
          k = stop;
        }
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

// for_each_scoped for the elements [begin, end) only.
template <typename Fn>
void for_each_scoped_in(const ScopeLayout& l, int64_t begin, int64_t end, Fn&& fn) {
  for_each_scope_run_in(l, begin, end, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
    if (step == 0) {
      for (int64_t j = 0; j < len; ++j) fn(k0 + j, q0);
    } else {
      for (int64_t j = 0; j < len; ++j) fn(k0 + j, q0 + j);
    }
  });
}

// Calls fn(k0, len, q0, step) for every run of the scope (as for_each_scope_run) on the
// thread pool, in tasks that own disjoint qparams indices: blocks of outer rows (token,
// group) or of channels (channel, every outer row of them), each index's runs visited in
// element order within one task. Per-qparams sums thus add in the sequential order whatever
// the thread count. The tensor scope is a single task (the caller chunks it, if it may).
template <typename Fn>
void parallel_scope_runs(const ScopeLayout& l, const Fn& fn) {
  const int64_t row = l.axis_len * l.inner, numel = l.outer * row;
  if (numel == 0) {  // only empty runs (a scope may still own one: a row of 0 tokens)
    for_each_scope_run(l, fn);
    return;
  }
  switch (l.kind) {
    case ScopeKind::tensor:
      fn(int64_t{0}, numel, int64_t{0}, int64_t{0});
      return;
    case ScopeKind::token:
    case ScopeKind::group:
      parallel_for(
          l.outer, std::max<int64_t>(1, kElementGrain / row),
          [&](int64_t o0, int64_t o1) { for_each_scope_run_in(l, o0 * row, o1 * row, fn); }, numel);
      return;
    case ScopeKind::channel:
      if (l.inner == 1) {
        // Column blocks of at least 64 channels keep the runs long enough for SIMD loops.
        const int64_t grain = std::max<int64_t>(64, kElementGrain / l.outer);
        parallel_for(
            l.axis_len, grain,
            [&](int64_t a0, int64_t a1) {
              for (int64_t o = 0; o < l.outer; ++o) fn(o * row + a0, a1 - a0, a0, int64_t{1});
            },
            numel);
      } else {
        const int64_t grain = std::max<int64_t>(1, kElementGrain / (l.outer * l.inner));
        parallel_for(
            l.axis_len, grain,
            [&](int64_t a0, int64_t a1) {
              for (int64_t o = 0; o < l.outer; ++o)
                for (int64_t a = a0; a < a1; ++a) fn(o * row + a * l.inner, l.inner, a, int64_t{0});
            },
            numel);
      }
      return;
  }
}

}  // namespace qg
