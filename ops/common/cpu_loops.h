// CPU loop helpers: element-wise maps with NumPy broadcasting (on the thread pool), and the
// mapping of a broadcast index back to an input offset. Kernels see contiguous tensors.
#pragma once

#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace qg::cpu {

// Strides (in elements) that read `in` as if broadcast to `out`: 0 on broadcast dimensions.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out);

// Calls fn(out_index, a_offset, b_offset) for every element of `out`.
template <typename Fn>
void for_each_broadcast(const Shape& out, const Shape& a, const Shape& b, Fn&& fn) {
  int64_t n = shape_numel(out);
  if (n == 0) return;
  if (a == out && b == out) {
    for (int64_t i = 0; i < n; ++i) fn(i, i, i);
    return;
  }
  std::vector<int64_t> sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  int d = static_cast<int>(out.size());
  std::vector<int64_t> idx(d, 0);
  int64_t inner = d ? out[d - 1] : 1;
  int64_t ia_step = d ? sa[d - 1] : 0, ib_step = d ? sb[d - 1] : 0;
  for (int64_t base = 0; base < n; base += inner) {
    int64_t ia = 0, ib = 0;
    for (int k = 0; k < d - 1; ++k) {
      ia += idx[k] * sa[k];
      ib += idx[k] * sb[k];
    }
    for (int64_t j = 0; j < inner; ++j) fn(base + j, ia + j * ia_step, ib + j * ib_step);
    for (int k = d - 2; k >= 0; --k) {
      if (++idx[k] < out[k]) break;
      idx[k] = 0;
    }
  }
}

// As for_each_broadcast, on the thread pool: fn(out_index, a_offset, b_offset) for every
// element of `out`, in chunks of kElementGrain output elements. Only for maps (fn writes
// out_index alone); reductions through for_each_broadcast stay sequential.
template <typename Fn>
void parallel_for_each_broadcast(const Shape& out, const Shape& a, const Shape& b, const Fn& fn) {
  const int64_t n = shape_numel(out);
  if (a == out && b == out) {
    parallel_for(n, kElementGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) fn(i, i, i);
    });
    return;
  }
  const std::vector<int64_t> sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  const int d = static_cast<int>(out.size());
  parallel_for(n, kElementGrain, [&](int64_t s, int64_t e) {
    // The multi-index of element s, then an odometer to e.
    std::vector<int64_t> idx(d, 0);
    int64_t ia = 0, ib = 0;
    for (int64_t k = d - 1, r = s; k >= 0; --k) {
      idx[k] = r % out[k];
      r /= out[k];
      ia += idx[k] * sa[k];
      ib += idx[k] * sb[k];
    }
    for (int64_t i = s; i < e; ++i) {
      fn(i, ia, ib);
      for (int k = d - 1; k >= 0; --k) {
        ia += sa[k];
        ib += sb[k];
        if (++idx[k] < out[k]) break;
        ia -= idx[k] * sa[k];
        ib -= idx[k] * sb[k];
        idx[k] = 0;
      }
    }
  });
}

// out = f(a, b) in the math type of the float dtype, with broadcasting, on the thread pool.
template <typename F>
void binary_float(const char* op, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  dispatch_float(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    parallel_for_each_broadcast(
        out.shape(), a.shape(), b.shape(), [&](int64_t o, int64_t ia, int64_t ib) {
          po[o] = static_cast<T>(f(static_cast<M>(pa[ia]), static_cast<M>(pb[ib])));
        });
  });
}

// out = f(a) element-wise, on the thread pool.
template <typename F>
void unary_float(const char* op, const Tensor& a, Tensor& out, F f) {
  dispatch_float(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    parallel_for(out.numel(), kElementGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = static_cast<T>(f(static_cast<M>(pa[i])));
    });
  });
}

}  // namespace qg::cpu
