// The CPU LSQ fast paths against the shared element math, bit for bit: the SSE backward run
// (dx, and the scale / zero-point sums added in the loop's documented order) and the forward
// through the fake-quantize SSE loops (every float dtype, per tensor and per channel on the
// last and first axes), on values at ties, range edges, zeros, NaN and infinities, for
// every run length up to 70 and around 128.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/lsq/lsq_math.h"
#include "ops/lsq/lsq_simd.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::run_op;

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// x values around the grid of scale s with zero point z in [qmin, qmax]: ties of x / s,
// both range ends and just past them, signed zeros, NaN, infinities, and random values.
std::vector<float> adversarial_x(int64_t n, float s, float z, float qmin, float qmax,
                                 uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f,
                                -0.0f,
                                std::nanf(""),
                                -inf,
                                inf,
                                0.5f * s,
                                -1.5f * s,
                                (qmax - z) * s,
                                (qmax - z + 1) * s,
                                (qmin - z) * s,
                                (qmin - z - 1) * s,
                                2.5f * s,
                                1e30f,
                                -1e30f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u((qmin - z - 4) * s, (qmax - z + 4) * s);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[i] = (rng() % 3 == 0) ? special[rng() % special.size()] : u(rng);
  return x;
}

std::vector<int64_t> lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 0; i <= 70; ++i) n.push_back(i);
  for (int64_t i : {127, 128, 129, 4099}) n.push_back(i);
  return n;
}

TEST(LsqSimd, BackwardRunMatchesElementMathBitForBit) {
  struct QP {
    float scale, zp, qmin, qmax;
  };
  for (const QP& p : {QP{0.02f, 3.0f, -128, 127}, QP{0.25f, 0.0f, 0, 15}, QP{1e-3f, 200, 0, 255}}) {
    const float inv = 1.0f / p.scale;
    const float zp_int = lsq::zero_point_int<float>(p.zp, p.qmin, p.qmax);
    for (int64_t n : lengths()) {
      std::vector<float> x = adversarial_x(n, p.scale, zp_int, p.qmin, p.qmax, 7 + n);
      std::vector<float> dy(static_cast<size_t>(n));
      std::mt19937 rng(99 + n);
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (auto& v : dy) v = d(rng);
      std::vector<float> dx(static_cast<size_t>(n), 123.0f);
      lsq_simd::RunSums got = lsq_simd::backward_run(x.data(), dy.data(), dx.data(), n,
                                                     {inv, p.scale, zp_int, p.qmin, p.qmax});
      // The documented order: lane (j % 4) sums of whole steps, (l0 + l1) + (l2 + l3), then
      // the tail element by element.
      double ds[4] = {}, dz[4] = {};
      const int64_t whole = n / 4 * 4;
      for (int64_t j = 0; j < n; ++j) {
        auto e = lsq::element_grad<float>(x[j], dy[j], inv, p.scale, zp_int, p.qmin, p.qmax);
        EXPECT_TRUE(same_bits(dx[j], e.dx)) << "n " << n << " j " << j << " x " << x[j];
        if (j < whole) {
          ds[j % 4] += e.dscale;
          dz[j % 4] += e.dzp;
        }
      }
      double want_s = (ds[0] + ds[1]) + (ds[2] + ds[3]), want_z = (dz[0] + dz[1]) + (dz[2] + dz[3]);
      // The tail is added to the lane total one element at a time, as the loop does.
      for (int64_t j = whole; j < n; ++j) {
        auto e = lsq::element_grad<float>(x[j], dy[j], inv, p.scale, zp_int, p.qmin, p.qmax);
        want_s += e.dscale;
        want_z += e.dzp;
      }
      EXPECT_TRUE(same_bits(got.dscale, want_s))
          << "n " << n << ": " << got.dscale << " vs " << want_s;
      EXPECT_TRUE(same_bits(got.dzp, want_z)) << "n " << n << ": " << got.dzp << " vs " << want_z;
    }
  }
}

// The op's forward (SSE fake-quantize runs and lanes) against lsq::forward element by element.
TEST(LsqSimd, ForwardMatchesElementMathBitForBit) {
  struct Scope {
    Shape x, q;
    Attrs attrs;
  };
  const std::vector<Scope> scopes = {
      {{3, 67}, {1}, {{"signed", true}}},
      {{5, 67}, {67}, {{"scope", "channel"}, {"axis", -1}, {"signed", true}}},
      {{6, 131}, {6}, {{"scope", "channel"}, {"axis", 0}, {"signed", true}}},
  };
  for (const Scope& sc : scopes) {
    const int64_t n = shape_numel(sc.x), nq = shape_numel(sc.q);
    std::vector<double> s(nq), z(nq);
    for (int64_t i = 0; i < nq; ++i) {
      s[i] = 0.01 * (1 + i % 5);
      z[i] = -3.4 + 0.7 * (i % 9);  // off the grid: rounded and clamped by the op
    }
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      std::vector<float> xf = adversarial_x(n, 0.02f, 0.0f, -128, 127, 5);
      std::vector<double> xd(xf.begin(), xf.end());
      Tensor x = Tensor::from_doubles(sc.x, xd, d);
      Tensor y = run_op(
          "lsq_fake_quantize",
          {x, Tensor::from_doubles(sc.q, s, DType::f32), Tensor::from_doubles(sc.q, z, DType::f32)},
          sc.attrs)[0];
      const bool last = sc.attrs.has("axis") && sc.attrs.get_int("axis") == -1;
      for (int64_t k = 0; k < n; ++k) {
        int64_t qi = nq == 1 ? 0 : (last ? k % sc.x[1] : k / sc.x[1]);
        float sf = static_cast<float>(s[qi]);
        float zi = lsq::zero_point_int<float>(static_cast<float>(z[qi]), -128.0f, 127.0f);
        float want =
            lsq::forward<float>(static_cast<float>(x.at(k)), 1.0f / sf, sf, zi, -128.0f, 127.0f);
        Tensor w = Tensor::from_doubles({1}, {want}, d);
        bool nan = std::isnan(want);
        EXPECT_TRUE(nan ? std::isnan(y.at(k))
                        : std::memcmp(static_cast<const char*>(y.raw_data()) + k * dtype_size(d),
                                      w.raw_data(), dtype_size(d)) == 0)
            << dtype_name(d) << " element " << k << ": " << y.at(k) << " vs " << want;
      }
    }
  }
}

}  // namespace
}  // namespace qg
