// CPU conv2d: for each image and group, im2col lays the receptive fields out as a
// [C/groups * kH * kW, Ho * Wo] matrix (zeros where the window covers padding), so
//   forward   y_g  = W_g [O/g, K] * col [K, P]           (+ bias)
//   dx        col  = W_g^T * dy_g, then col2im adds each column entry back to its pixel
//   dw        dW_g += dy_g [O/g, P] * col^T [P, K]
// The GEMMs are Eigen products on row-major maps of the tensors' own memory. The forward and
// dx run one image per task on the thread pool, dw one fixed block of images per task (its
// sums then added in block order), the bias gradient chunks of channels.
#include "ops/conv/conv_cpu.h"
#include "ops/common/dispatch_f32_f64.h"

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace qg {
namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MapMat = Eigen::Map<RowMat<T>>;
template <typename T>
using MapConstMat = Eigen::Map<const RowMat<T>>;

// col[(c * kH + i) * kW + j][oh * Wo + ow] = x[c][oh*sH - pH + i*dH][ow*sW - pW + j*dW]
// for the C/groups channels starting at `x` (one image, one group).
template <typename T>
void im2col(const ConvGeometry& g, const T* x, T* col) {
  const int64_t cg = g.c_per_group();
  for (int64_t c = 0; c < cg; ++c) {
    const T* plane = x + c * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = col + ((c * g.kh + i) * g.kw + j) * g.ho * g.wo;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          T* out = row + oh * g.wo;
          if (ih < 0 || ih >= g.h) {
            for (int64_t ow = 0; ow < g.wo; ++ow) out[ow] = T(0);
            continue;
          }
          const T* src = plane + ih * g.w;
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            out[ow] = (iw >= 0 && iw < g.w) ? src[iw] : T(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds every column entry to the pixel it was read from.
template <typename T>
void col2im_add(const ConvGeometry& g, const T* col, T* x) {
  const int64_t cg = g.c_per_group();
  for (int64_t c = 0; c < cg; ++c) {
    T* plane = x + c * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((c * g.kh + i) * g.kw + j) * g.ho * g.wo;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          const T* in = row + oh * g.wo;
          T* dst = plane + ih * g.w;
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            if (iw >= 0 && iw < g.w) dst[iw] += in[ow];
          }
        }
      }
    }
  }
}

// A per-thread im2col buffer of at least n elements, kept between calls (a fresh one per
// image would be mapped and faulted in every time).
template <typename T>
T* col_buffer(int64_t n) {
  thread_local std::vector<T> col;
  if (col.size() < static_cast<size_t>(n)) col.resize(static_cast<size_t>(n));
  return col.data();
}

// Images are independent in the forward and in dx: one task per image on the thread pool,
// each running the same GEMMs as a single thread would.
template <typename T>
void forward(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const int64_t cg = g.c_per_group(), og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t gemm_work = g.n * g.groups * og * k * p / 16;  // element-equivalents
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b.data<T>();
  T* yp = y.data<T>();
  parallel_chunks(
      g.n,
      [&](int64_t n) {
        T* col = col_buffer<T>(k * p);
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          im2col(g, xp + (n * g.c + grp * cg) * g.h * g.w, col);
          MapConstMat<T> wg(wp + grp * og * k, og, k);
          MapConstMat<T> cm(col, k, p);
          MapMat<T> yg(yp + (n * g.o + grp * og) * p, og, p);
          yg.noalias() = wg * cm;
        }
        for (int64_t oc = 0; oc < g.o; ++oc) {
          T* row = yp + (n * g.o + oc) * p;
          for (int64_t i = 0; i < p; ++i) row[i] += bp[oc];
        }
      },
      gemm_work);
}

template <typename T>
void backward_input(const ConvGeometry& g, const Tensor& dy, const Tensor& w, Tensor& dx) {
  const int64_t cg = g.c_per_group(), og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t gemm_work = g.n * g.groups * og * k * p / 16;  // element-equivalents
  const T* dyp = dy.data<T>();
  const T* wp = w.data<T>();
  T* dxp = dx.data<T>();
  parallel_chunks(
      g.n,
      [&](int64_t n) {
        T* col = col_buffer<T>(k * p);
        std::fill(dxp + n * g.c * g.h * g.w, dxp + (n + 1) * g.c * g.h * g.w, T(0));
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          MapConstMat<T> wg(wp + grp * og * k, og, k);
          MapConstMat<T> dyg(dyp + (n * g.o + grp * og) * p, og, p);
          MapMat<T> cm(col, k, p);
          cm.noalias() = wg.transpose() * dyg;
          col2im_add(g, col, dxp + (n * g.c + grp * cg) * g.h * g.w);
        }
      },
      gemm_work);
}

// dw sums over images. Images go in fixed blocks of kImagesPerBlock: each block sums its
// images in order into its own buffer (the first into dw itself), on the thread pool, then
// the blocks' sums are added to dw in block order. The blocks depend on the batch alone, so
// the bytes do not depend on the thread count; a batch of one block gives exactly the
// single-threaded loop's bytes.
constexpr int64_t kImagesPerBlock = 8;

template <typename T>
void backward_weight(const ConvGeometry& g, const Tensor& dy, const Tensor& x, Tensor& dw) {
  const int64_t cg = g.c_per_group(), og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t gemm_work = g.n * g.groups * og * k * p / 16;  // element-equivalents
  const int64_t blocks = num_chunks(g.n, kImagesPerBlock), size = dw.numel();
  if (blocks == 0) {  // no images: dw = 0
    std::fill(dw.data<T>(), dw.data<T>() + size, T(0));
    return;
  }
  std::vector<T> partial(static_cast<size_t>((blocks - 1) * size));
  const T* dyp = dy.data<T>();
  const T* xp = x.data<T>();
  parallel_chunks(
      blocks,
      [&](int64_t blk) {
        T* acc = blk == 0 ? dw.data<T>() : partial.data() + (blk - 1) * size;
        std::fill(acc, acc + size, T(0));
        T* col = col_buffer<T>(k * p);
        const int64_t end = std::min(g.n, (blk + 1) * kImagesPerBlock);
        for (int64_t n = blk * kImagesPerBlock; n < end; ++n) {
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            im2col(g, xp + (n * g.c + grp * cg) * g.h * g.w, col);
            MapConstMat<T> cm(col, k, p);
            MapConstMat<T> dyg(dyp + (n * g.o + grp * og) * p, og, p);
            MapMat<T> dwg(acc + grp * og * k, og, k);
            dwg.noalias() += dyg * cm.transpose();
          }
        }
      },
      gemm_work);
  T* dwp = dw.data<T>();
  for (int64_t blk = 1; blk < blocks; ++blk) {
    const T* part = partial.data() + (blk - 1) * size;
    for (int64_t i = 0; i < size; ++i) dwp[i] += part[i];
  }
}

// db[o] = sum over n, h, w of dy[n, o, h, w], accumulated in the element type per image
// plane (f64 for f64) in plane order; channels are independent, so they run on the thread
// pool in chunks, each channel summed as on one thread.
template <typename T>
void backward_bias(const Tensor& dy, Tensor& db) {
  const int64_t n = dy.size(0), o = dy.size(1), p = dy.size(2) * dy.size(3);
  const T* dyp = dy.data<T>();
  T* dbp = db.data<T>();
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, n * p));
  parallel_for(
      o, grain,
      [&](int64_t begin, int64_t end) {
        for (int64_t oc = begin; oc < end; ++oc) {
          T total = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* plane = dyp + (i * o + oc) * p;
            T s = 0;
            for (int64_t j = 0; j < p; ++j) s += plane[j];
            total += s;
          }
          dbp[oc] = total;
        }
      },
      dy.numel());
}

}  // namespace

void conv2d_forward_cpu(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& b,
                        Tensor& y) {
  if (y.numel() == 0) return;
  dispatch_f32_f64(x.dtype(), "conv2d", [&](auto tag) { forward<decltype(tag)>(g, x, w, b, y); });
}

void conv2d_backward_input_cpu(const ConvGeometry& g, const Tensor& dy, const Tensor& w,
                               Tensor& dx) {
  if (dx.numel() == 0) return;
  dispatch_f32_f64(dy.dtype(), "conv2d_backward_input",
                   [&](auto tag) { backward_input<decltype(tag)>(g, dy, w, dx); });
}

void conv2d_backward_weight_cpu(const ConvGeometry& g, const Tensor& dy, const Tensor& x,
                                Tensor& dw) {
  if (dw.numel() == 0) return;
  dispatch_f32_f64(dy.dtype(), "conv2d_backward_weight",
                   [&](auto tag) { backward_weight<decltype(tag)>(g, dy, x, dw); });
}

void conv2d_backward_bias_cpu(const Tensor& dy, Tensor& db) {
  if (db.numel() == 0) return;
  dispatch_f32_f64(dy.dtype(), "conv2d_backward_bias",
                   [&](auto tag) { backward_bias<decltype(tag)>(dy, db); });
}

}  // namespace qg
