// A direct (loop-over-every-tap) conv2d and its adjoints in f64, written from the
// definition y[n, o, oh, ow] = b[o] + sum_{c, i, j} x[n, g*C/G + c, oh*sH - pH + i*dH,
// ow*sW - pW + j*dW] * w[o, c, i, j] (g = o's group; zero outside the input). The tests
// compare the im2col kernels against it.
#pragma once

#include <cstdint>
#include <vector>

namespace qg::testing {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int64_t ho() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t wo() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// Calls fn(x_index, w_index, y_index) for every multiply-add of the convolution.
template <typename Fn>
void for_each_tap(const ConvCase& k, Fn&& fn) {
  const int64_t cg = k.c / k.groups, og = k.o / k.groups, ho = k.ho(), wo = k.wo();
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t ih = oh * k.sh - k.ph + i * k.dh, iw = ow * k.sw - k.pw + j * k.dw;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const int64_t xc = (o / og) * cg + c;
                fn(((n * k.c + xc) * k.h + ih) * k.w + iw, ((o * cg + c) * k.kh + i) * k.kw + j,
                   ((n * k.o + o) * ho + oh) * wo + ow);
              }
}

inline std::vector<double> conv_ref(const ConvCase& k, const std::vector<double>& x,
                                    const std::vector<double>& w, const std::vector<double>& b) {
  const int64_t plane = k.ho() * k.wo();
  std::vector<double> y(static_cast<size_t>(k.n * k.o * plane));
  for (size_t i = 0; i < y.size(); ++i) y[i] = b[(i / plane) % k.o];
  for_each_tap(k, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

inline std::vector<double> conv_dx_ref(const ConvCase& k, const std::vector<double>& dy,
                                       const std::vector<double>& w) {
  std::vector<double> dx(static_cast<size_t>(k.n * k.c * k.h * k.w), 0.0);
  for_each_tap(k, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}

inline std::vector<double> conv_dw_ref(const ConvCase& k, const std::vector<double>& dy,
                                       const std::vector<double>& x) {
  std::vector<double> dw(static_cast<size_t>(k.o * (k.c / k.groups) * k.kh * k.kw), 0.0);
  for_each_tap(k, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += dy[yi] * x[xi]; });
  return dw;
}

inline std::vector<double> conv_db_ref(const ConvCase& k, const std::vector<double>& dy) {
  const int64_t plane = k.ho() * k.wo();
  std::vector<double> db(static_cast<size_t>(k.o), 0.0);
  for (size_t i = 0; i < dy.size(); ++i) db[(i / plane) % k.o] += dy[i];
  return db;
}

}  // namespace qg::testing
