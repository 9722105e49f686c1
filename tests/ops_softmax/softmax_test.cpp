// softmax and softmax_backward: values worked out by hand, the all -inf column (NaN, as in
// PyTorch), bad inputs, and the CUDA kernels (warp rows, block rows, strided columns)
// against the CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

Tensor f64(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::f64);
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(Softmax, LastAxisByHand) {
  // exp(0), exp(ln 2), exp(ln 3) = 1, 2, 3 over a sum of 6; a constant row is uniform.
  Tensor x = f64({2, 3}, {0, std::log(2.0), std::log(3.0), 5, 5, 5});
  std::vector<double> y = run_op(Device::cpu(), "softmax", {x})[0].to_doubles();
  expect_near_all(y, {1.0 / 6, 2.0 / 6, 3.0 / 6, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-15);
}

TEST(Softmax, AxisZeroAndMiddleAxisByHand) {
  // Columns of [[0, 0], [ln 3, 0]]: (1, 3) / 4 and (1, 1) / 2.
  Tensor x = f64({2, 2}, {0, 0, std::log(3.0), 0});
  expect_near_all(run_op(Device::cpu(), "softmax", {x}, {{"axis", 0}})[0].to_doubles(),
                  {0.25, 0.5, 0.75, 0.5}, 1e-15);
  // [1, 2, 2] along axis 1: each (outer, inner) column is (a, b) with a = ln 3 or 0.
  Tensor m = f64({1, 2, 2}, {std::log(3.0), 0, 0, 0});
  expect_near_all(run_op(Device::cpu(), "softmax", {m}, {{"axis", -2}})[0].to_doubles(),
                  {0.75, 0.5, 0.25, 0.5}, 1e-15);
}

TEST(Softmax, LargeInputsAreMaxShifted) {
  // Without the max shift exp(1000) overflows; with it the pair is (1, e) / (1 + e).
  Tensor x = Tensor::from_doubles({2}, {1000, 1001}, DType::f32);
  std::vector<double> y = run_op(Device::cpu(), "softmax", {x})[0].to_doubles();
  const double e = std::exp(1.0);
  expect_near_all(y, {1 / (1 + e), e / (1 + e)}, 1e-7);
}

TEST(Softmax, AllMinusInfRowIsNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_doubles({2, 2}, {-inf, -inf, -inf, 0}, DType::f32);
  std::vector<double> y = run_op(Device::cpu(), "softmax", {x})[0].to_doubles();
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[3], 1.0);
}

TEST(Softmax, ScalarIsOne) {
  std::vector<double> y = run_op(Device::cpu(), "softmax", {f64({}, {-3})})[0].to_doubles();
  EXPECT_EQ(y, std::vector<double>{1.0});
}

TEST(SoftmaxBackward, ByHand) {
  // y = (1/4, 3/4), dy = (1, 0): sum(dy * y) = 1/4, dx = y * (dy - 1/4) = (3/16, -3/16).
  Tensor dy = f64({1, 2}, {1, 0}), y = f64({1, 2}, {0.25, 0.75});
  expect_near_all(run_op(Device::cpu(), "softmax_backward", {dy, y})[0].to_doubles(),
                  {0.1875, -0.1875}, 1e-15);
  // Along axis 0 of [2, 1], the same column.
  expect_near_all(run_op(Device::cpu(), "softmax_backward",
                         {f64({2, 1}, {1, 0}), f64({2, 1}, {0.25, 0.75})}, {{"axis", 0}})[0]
                      .to_doubles(),
                  {0.1875, -0.1875}, 1e-15);
}

TEST(SoftmaxErrors, AxisOutOfRange) {
  expect_error(
      [] {
        run_op(Device::cpu(), "softmax", {f64({2, 3}, std::vector<double>(6))}, {{"axis", 2}});
      },
      {"[softmax]", "'axis' = 2", "rank 2"});
  expect_error(
      [] {
        run_op(Device::cpu(), "softmax", {f64({2, 3}, std::vector<double>(6))}, {{"axis", -3}});
      },
      {"[softmax]", "'axis' = -3"});
}

TEST(SoftmaxErrors, IntegerInputAndBackwardShapes) {
  expect_error(
      [] {
        run_op(Device::cpu(), "softmax", {Tensor::from_vector<int64_t>({2}, {1, 2})});
      },
      {"[softmax]", "floating point", "i64"});
  expect_error(
      [] {
        run_op(Device::cpu(), "softmax_backward",
               {f64({2, 3}, std::vector<double>(6)), f64({3, 2}, std::vector<double>(6))});
      },
      {"[softmax_backward]", "same shape", "[2, 3]", "[3, 2]"});
}

// ---- GPU against the CPU reference ------------------------------------------------------

Tensor random_tensor(const Shape& s, DType d, uint32_t seed, double lo = -4, double hi = 4) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& e : v) e = u(rng);
  return Tensor::from_doubles(s, v, d);
}

// Relative to the largest magnitude of the CPU result (probabilities are at most 1).
void expect_close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  std::vector<double> a = cpu.to_doubles(), b = gpu.to_doubles();
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 1e-30, worst = 0;
  for (double v : a) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst / scale, tol) << what;
}

double tolerance(DType d) {
  return d == DType::f64 ? 1e-12 : d == DType::f32 ? 1e-5 : d == DType::f16 ? 2e-3 : 1.6e-2;
}

struct Layout {
  Shape shape;
  int axis;
};

TEST(SoftmaxGpu, MatchesCpuOnEveryLayout) {
  QG_REQUIRE_GPU();
  // Warp rows (short last axis), block rows (long last axis), strided columns (axis 0, 1).
  const std::vector<Layout> layouts = {{{37, 1000}, -1}, {{3, 33}, 1},  {{5, 3000}, -1},
                                       {{4, 7, 9}, 1},   {{300, 6}, 0}, {{8}, 0}};
  uint32_t seed = 1;
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Layout& l : layouts) {
      std::string what =
          std::string(dtype_name(d)) + shape_str(l.shape) + " axis " + std::to_string(l.axis);
      Tensor x = random_tensor(l.shape, d, seed++);
      Tensor dy = random_tensor(l.shape, d, seed++, -1, 1);
      Attrs a{{"axis", l.axis}};
      Tensor yc = run_op(Device::cpu(), "softmax", {x}, a)[0];
      Tensor yg = run_op(Device::cuda(), "softmax", {x}, a)[0];
      expect_close(yc, yg, tolerance(d), "softmax " + what);
      expect_close(run_op(Device::cpu(), "softmax_backward", {dy, yc}, a)[0],
                   run_op(Device::cuda(), "softmax_backward", {dy, yc}, a)[0], tolerance(d),
                   "softmax_backward " + what);
    }
  }
}

TEST(SoftmaxGpu, AllMinusInfRowIsNaN) {
  QG_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_doubles({2, 2}, {-inf, -inf, 0, 0}, DType::f32);
  std::vector<double> y = run_op(Device::cuda(), "softmax", {x})[0].to_doubles();
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
  EXPECT_EQ(y[2], 0.5);
  std::vector<double> c = run_op(Device::cuda(), "softmax", {x}, {{"axis", 0}})[0].to_doubles();
  EXPECT_EQ(c[0], 0.0);
  EXPECT_EQ(c[2], 1.0);
}

}  // namespace
}  // namespace qg
