// CPU kernels of the pooling ops, and the attribute validation both backends share. The
// window loops visit cells in the order of ops/pool/pool_geometry.h; the CUDA kernels visit
// them in the same order, so results are bit-identical.
#include "ops/pool/pool_cpu.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/pool/pool_attrs.h"

namespace qg {
namespace {

std::string ints_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::vector<int64_t> pair_attr(const std::string& op, const Attrs& a, const std::string& name,
                               const std::vector<int64_t>& fallback) {
  if (!a.has(name)) return fallback;
  const std::vector<int64_t>& v = a.get_ints(name);
  QG_CHECK(v.size() == 2, op, "attribute '", name, "' must have 2 values [h, w], got ",
           ints_str(v));
  return v;
}

// PyTorch's pooling output size (see pool_geometry.h); <= 0 when the window does not fit.
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  // The ceil term is added before the (floor) division, so in ceil mode a window one stride
  // too long still yields one output, as in PyTorch.
  const int64_t span = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  if (span < 0) return 0;
  int64_t out = span / s + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

}  // namespace

pool::PoolGeom pool_geometry(const std::string& op, const Shape& x, const Attrs& a) {
  QG_CHECK(x.size() == 4, op, "input x must be rank 4 (N, C, H, W), got shape ", shape_str(x));
  std::vector<int64_t> k = pair_attr(op, a, "kernel", {});
  std::vector<int64_t> s = pair_attr(op, a, "stride", k);
  std::vector<int64_t> p = pair_attr(op, a, "padding", {0, 0});
  std::vector<int64_t> d = pair_attr(op, a, "dilation", {1, 1});
  QG_CHECK(k[0] > 0 && k[1] > 0, op, "attribute 'kernel' = ", ints_str(k), " must be positive");
  QG_CHECK(s[0] > 0 && s[1] > 0, op, "attribute 'stride' = ", ints_str(s), " must be positive");
  QG_CHECK(d[0] > 0 && d[1] > 0, op, "attribute 'dilation' = ", ints_str(d), " must be positive");
  QG_CHECK(p[0] >= 0 && p[1] >= 0 && p[0] <= k[0] / 2 && p[1] <= k[1] / 2, op,
           "attribute 'padding' = ", ints_str(p), " must be in [0, kernel / 2] for kernel ",
           ints_str(k));
  const bool ceil_mode = a.has("ceil_mode") && a.get_bool("ceil_mode");
  pool::PoolGeom g;
  g.planes = x[0] * x[1];
  g.H = x[2];
  g.W = x[3];
  g.kH = k[0], g.kW = k[1], g.sH = s[0], g.sW = s[1];
  g.pH = p[0], g.pW = p[1], g.dH = d[0], g.dW = d[1];
  g.count_include_pad = !a.has("count_include_pad") || a.get_bool("count_include_pad");
  g.OH = pooled_size(g.H, g.kH, g.sH, g.pH, g.dH, ceil_mode);
  g.OW = pooled_size(g.W, g.kW, g.sW, g.pW, g.dW, ceil_mode);
  QG_CHECK(g.OH > 0 && g.OW > 0, op, "kernel ", ints_str(k), " (dilation ", ints_str(d),
           ") is larger than the padded input: input ", shape_str(x), ", padding ", ints_str(p));
  return g;
}

namespace cpu {
namespace {

// Planes are independent: chunks of whole planes (about kElementGrain input elements each)
// give the same bytes for any thread count.
template <typename Fn>
void for_plane_chunks(const pool::PoolGeom& g, const Fn& fn) {
  const int64_t per_plane = std::max<int64_t>(g.H * g.W, 1);
  parallel_for(g.planes, std::max<int64_t>(1, kElementGrain / per_plane), fn, g.planes * per_plane);
}
template <typename Fn>
void for_planes(const pool::PoolGeom& g, const Fn& fn) {
  for_plane_chunks(g, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p);
  });
}

}  // namespace

void max_pool2d(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const pool::PoolGeom& g = ctx.args<PoolArgs>().geometry;
  int64_t* pi = ctx.outputs[1].data<int64_t>();
  dispatch_float(x.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* px = x.data<T>();
    T* py = ctx.outputs[0].data<T>();
    for_planes(g, [&](int64_t p) {
      const T* plane = px + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const pool::Window w = pool::max_window(g, oh, ow);
          M best = static_cast<M>(-INFINITY);
          int64_t arg = w.h0 * g.W + w.w0;
          for (int64_t h = w.h0; h < w.h1; h += g.dH)
            for (int64_t c = w.w0; c < w.w1; c += g.dW) {
              const M v = static_cast<M>(plane[h * g.W + c]);
              if (v > best || v != v) {  // a NaN wins, and the last NaN of the window
                best = v;
                arg = h * g.W + c;
              }
            }
          const int64_t o = (p * g.OH + oh) * g.OW + ow;
          py[o] = static_cast<T>(best);
          pi[o] = arg;
        }
    });
  });
}

void max_pool2d_backward(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const pool::PoolGeom& g = ctx.args<PoolArgs>().geometry;
  const int64_t* pi = ctx.inputs[1].data<int64_t>();
  dispatch_float(dy.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pdy = dy.data<T>();
    T* pdx = ctx.outputs[0].data<T>();
    const int64_t plane = g.H * g.W, out_plane = g.OH * g.OW;
    for_plane_chunks(g, [&](int64_t p0, int64_t p1) {
      std::vector<M> acc(static_cast<size_t>(plane));
      for (int64_t p = p0; p < p1; ++p) {
        std::fill(acc.begin(), acc.end(), M(0));
        // Scatter in output order: each input cell sums its windows' gradients in the order
        // the CUDA gather visits them.
        for (int64_t o = 0; o < out_plane; ++o) {
          const int64_t i = pi[p * out_plane + o];
          if (pool::is_empty(pool::max_window(g, o / g.OW, o % g.OW)) || i < 0 || i >= plane)
            continue;
          acc[i] += static_cast<M>(pdy[p * out_plane + o]);
        }
        for (int64_t i = 0; i < plane; ++i) pdx[p * plane + i] = static_cast<T>(acc[i]);
      }
    });
  });
}

void avg_pool2d(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const pool::PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(x.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* px = x.data<T>();
    T* py = ctx.outputs[0].data<T>();
    for_planes(g, [&](int64_t p) {
      const T* plane = px + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          int64_t divisor = 0;
          const pool::Window w = pool::avg_window(g, oh, ow, divisor);
          M sum = M(0);
          for (int64_t h = w.h0; h < w.h1; ++h)
            for (int64_t c = w.w0; c < w.w1; ++c) sum += static_cast<M>(plane[h * g.W + c]);
          py[(p * g.OH + oh) * g.OW + ow] =
              static_cast<T>(divisor == 0 ? M(0) : sum / static_cast<M>(divisor));
        }
    });
  });
}

void avg_pool2d_backward(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const pool::PoolGeom& g = ctx.args<PoolArgs>().geometry;
  dispatch_float(dy.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pdy = dy.data<T>();
    T* pdx = ctx.outputs[0].data<T>();
    for_plane_chunks(g, [&](int64_t p0, int64_t p1) {
      std::vector<M> acc(static_cast<size_t>(g.H * g.W));
      for (int64_t p = p0; p < p1; ++p) {
        std::fill(acc.begin(), acc.end(), M(0));
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            int64_t divisor = 0;
            const pool::Window w = pool::avg_window(g, oh, ow, divisor);
            if (divisor == 0) continue;
            const M share =
                static_cast<M>(pdy[(p * g.OH + oh) * g.OW + ow]) / static_cast<M>(divisor);
            for (int64_t h = w.h0; h < w.h1; ++h)
              for (int64_t c = w.w0; c < w.w1; ++c) acc[h * g.W + c] += share;
          }
        for (int64_t i = 0; i < g.H * g.W; ++i) pdx[p * g.H * g.W + i] = static_cast<T>(acc[i]);
      }
    });
  });
}

void global_avg_pool2d(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t planes = x.shape()[0] * x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  dispatch_float(x.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* px = x.data<T>();
    T* py = ctx.outputs[0].data<T>();
    const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(hw, 1));
    parallel_for(
        planes, grain,
        [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            // The order the CUDA kernel's warp per plane sums in (pool_geometry.h, kPlaneSumLanes).
            M part[pool::kPlaneSumLanes] = {};
            for (int64_t i = 0; i < hw; ++i)
              part[i % pool::kPlaneSumLanes] += static_cast<M>(px[p * hw + i]);
            for (int off = pool::kPlaneSumLanes / 2; off > 0; off /= 2)
              for (int j = 0; j < off; ++j) part[j] = part[j] + part[j + off];
            py[p] = static_cast<T>(part[0] / static_cast<M>(hw));
          }
        },
        planes * hw);
  });
}

void global_avg_pool2d_backward(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Shape& s = ctx.outputs[0].shape();
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
  dispatch_float(dy.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const T* pdy = dy.data<T>();
    T* pdx = ctx.outputs[0].data<T>();
    const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(hw, 1));
    parallel_for(
        planes, grain,
        [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            const T v = static_cast<T>(static_cast<M>(pdy[p]) / static_cast<M>(hw));
            for (int64_t i = 0; i < hw; ++i) pdx[p * hw + i] = v;
          }
        },
        planes * hw);
  });
}

}  // namespace cpu
}  // namespace qg
