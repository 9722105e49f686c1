// batch_norm and layer_norm on inputs whose statistics are worked out by hand in the
// comments: batch statistics and the running-stat update over two steps, eval and frozen
// modes, the backward in both modes, and one test per bad input. GPU-vs-CPU comparisons are
// in norm_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;

// A batch_norm graph whose running statistics are parameters (module buffers), as nn builds
// it; returns the executor so tests can read the buffers and set the frozen state.
struct BnGraph {
  Graph g;
  ValueId y, save_mean, save_invstd, used;
  NodeId bn;
  std::unique_ptr<Executor> exec;
  BnGraph(const Shape& x_shape, const std::vector<double>& gamma, const std::vector<double>& beta,
          double momentum = 0.1, Device device = Device::cpu()) {
    int64_t c = x_shape[1];
    ValueId x = g.input("x", {DType::f32, x_shape});
    ValueId ga = g.constant(Tensor::from_doubles({c}, gamma, DType::f32));
    ValueId be = g.constant(Tensor::from_doubles({c}, beta, DType::f32));
    ValueId rm = g.parameter("running_mean", Tensor::zeros({c}, DType::f32));
    ValueId rv = g.parameter("running_var",
                             Tensor::from_doubles({c}, std::vector<double>(c, 1.0), DType::f32));
    auto out = g.apply("batch_norm", {x, ga, be, rm, rv}, {{"momentum", momentum}}, "bn");
    y = out[0], save_mean = out[1], save_invstd = out[2], used = out[3];
    bn = g.value(y).producer;
    exec = std::make_unique<Executor>(g, device);
  }
  std::vector<Tensor> run(const Tensor& x) {
    auto got = exec->run({{"x", x}}, {y, save_mean, save_invstd, used});
    for (Tensor& t : got) t = t.to(Device::cpu());
    return got;
  }
  std::vector<double> buffer(const std::string& name) {
    return exec->parameter(name).to(Device::cpu()).to_doubles();
  }
};

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// x [2, 2, 1, 2]: channel 0 holds {1, 3, 5, 7} (mean 4, biased var 5, unbiased 20/3),
// channel 1 holds {2, 2, 4, 4} (mean 3, var 1, unbiased 4/3).
Tensor small_batch() {
  return Tensor::from_doubles({2, 2, 1, 2}, {1, 3, 2, 2, 5, 7, 4, 4}, DType::f32);
}

TEST(BatchNorm, BatchStatisticsAndRunningUpdate) {
  BnGraph b({2, 2, 1, 2}, {2, 1}, {0.5, -1});
  auto out = b.run(small_batch());
  const double e = 1e-5, s0 = 1 / std::sqrt(5 + e), s1 = 1 / std::sqrt(1 + e);
  // y = (x - mean) * invstd * gamma + beta.
  expect_near_all(out[0].to_doubles(),
                  {-3 * s0 * 2 + 0.5, -1 * s0 * 2 + 0.5, -1 * s1 - 1, -1 * s1 - 1, 1 * s0 * 2 + 0.5,
                   3 * s0 * 2 + 0.5, 1 * s1 - 1, 1 * s1 - 1});
  expect_near_all(out[1].to_doubles(), {4, 3});
  expect_near_all(out[2].to_doubles(), {s0, s1});
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{1}));
  // Running stats: 0.9 * (0, 1) + 0.1 * (mean, unbiased var).
  expect_near_all(b.buffer("running_mean"), {0.4, 0.3});
  expect_near_all(b.buffer("running_var"), {0.9 + 0.1 * 20.0 / 3.0, 0.9 + 0.1 * 4.0 / 3.0});
  b.run(small_batch());  // second step: 0.9 * previous + 0.1 * the same batch
  expect_near_all(b.buffer("running_mean"), {0.9 * 0.4 + 0.4, 0.9 * 0.3 + 0.3});
}

TEST(BatchNorm, EvalAndFrozenUseRunningStatisticsAndUpdateNothing) {
  BnGraph b({2, 2, 1, 2}, {1, 1}, {0, 0});
  b.run(small_batch());  // running mean (0.4, 0.3)
  auto rm = b.buffer("running_mean"), rv = b.buffer("running_var");
  b.exec->set_training(false);
  auto out = b.run(small_batch());
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{0}));
  expect_near_all(out[1].to_doubles(), rm);
  // x = 1 in channel 0: (1 - 0.4) / sqrt(rv0 + eps).
  EXPECT_NEAR(out[0].to_doubles()[0], 0.6 / std::sqrt(rv[0] + 1e-5), 1e-6);
  EXPECT_EQ(b.buffer("running_mean"), rm);
  b.exec->set_training(true);
  b.exec->state(b.bn, "frozen").data<float>()[0] = 1.0f;
  out = b.run(small_batch());
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{0}));
  EXPECT_EQ(b.buffer("running_mean"), rm);
  EXPECT_EQ(b.buffer("running_var"), rv);
}

// The backward in both modes against hand-derived formulas: with batch statistics
// dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)); with running ones
// dx = gamma * invstd * dy.
TEST(BatchNorm, BackwardInBothModes) {
  Tensor x = small_batch();
  Tensor dy = Tensor::from_doubles({2, 2, 1, 2}, {1, 0, 0, 2, 0, 0, 1, 0}, DType::f32);
  for (double used : {1.0, 0.0}) {
    Tensor mean = Tensor::from_doubles({2}, {4, 3}, DType::f32);
    Tensor invstd = Tensor::from_doubles({2}, {0.5, 1}, DType::f32);
    Tensor gamma = Tensor::from_doubles({2}, {2, 1}, DType::f32);
    auto out = testing::run_op(Device::cpu(), "batch_norm_backward",
                               {dy, x, gamma, mean, invstd, Tensor::from_doubles({1}, {used})});
    // Channel 0: x {1,3,5,7}, xhat {-1.5,-0.5,0.5,1.5}, dy {1,0,0,0}: dbeta 1, dgamma -1.5;
    // channel 1: x {2,2,4,4}, xhat {-1,-1,1,1}, dy {0,2,1,0}: dbeta 3, dgamma -1.
    expect_near_all(out[2].to_doubles(), {1, 3});
    expect_near_all(out[1].to_doubles(), {-1.5, -1});
    std::vector<double> dx = out[0].to_doubles();
    if (used == 1.0) {
      // ch0: 1 * (dy - 0.25 - xhat * (-0.375)); ch1: 1 * (dy - 0.75 - xhat * (-0.25)).
      expect_near_all(dx, {1 - 0.25 - 0.5625, -0.25 - 0.1875, -0.75 - 0.25, 2 - 0.75 - 0.25,
                           -0.25 + 0.1875, -0.25 + 0.5625, 1 - 0.75 + 0.25, -0.75 + 0.25});
    } else {
      expect_near_all(dx, {1, 0, 0, 2, 0, 0, 1, 0});
    }
  }
}

TEST(LayerNorm, RowsNormalisedOverTheLastAxis) {
  // Row {1, 2, 3, 6}: mean 3, var (4 + 1 + 0 + 9) / 4 = 3.5; row {0, 0, 0, 4}: mean 1, var 3.
  Tensor x = Tensor::from_doubles({2, 4}, {1, 2, 3, 6, 0, 0, 0, 4}, DType::f32);
  Tensor gamma = Tensor::from_doubles({4}, {1, 2, 1, 1}, DType::f32);
  Tensor beta = Tensor::from_doubles({4}, {0, 0, 1, 0}, DType::f32);
  auto out = testing::run_op(Device::cpu(), "layer_norm", {x, gamma, beta});
  const double r0 = 1 / std::sqrt(3.5 + 1e-5), r1 = 1 / std::sqrt(3 + 1e-5);
  expect_near_all(out[0].to_doubles(), {-2 * r0, -2 * r0, 1, 3 * r0, -r1, -2 * r1, 1 - r1, 3 * r1});
  expect_near_all(out[1].to_doubles(), {3, 1});
  expect_near_all(out[2].to_doubles(), {r0, r1});
}

TEST(LayerNorm, BackwardOfAConstantGradientIsZeroForDx) {
  // With gamma = 1 and dy the same on a row, dx = rstd * (dy - mean(dy) - xhat * mean(dy *
  // xhat)) = 0 (xhat sums to 0); dbeta sums dy over rows, dgamma sums dy * xhat.
  Tensor x = Tensor::from_doubles({2, 3}, {1, 2, 3, 2, 4, 6}, DType::f32);
  Tensor dy = Tensor::from_doubles({2, 3}, {1, 1, 1, 2, 2, 2}, DType::f32);
  auto fw = testing::run_op(Device::cpu(), "layer_norm",
                            {x, Tensor::from_doubles({3}, {1, 1, 1}, DType::f32),
                             Tensor::from_doubles({3}, {0, 0, 0}, DType::f32)});
  auto out =
      testing::run_op(Device::cpu(), "layer_norm_backward",
                      {dy, x, Tensor::from_doubles({3}, {1, 1, 1}, DType::f32), fw[1], fw[2]});
  expect_near_all(out[0].to_doubles(), {0, 0, 0, 0, 0, 0}, 1e-6);
  expect_near_all(out[2].to_doubles(), {3, 3, 3});
  const double xh = std::sqrt(1.5);  // xhat of row 0 and row 1: {-1.2247, 0, 1.2247}
  expect_near_all(out[1].to_doubles(), {-3 * xh, 0, 3 * xh}, 1e-4);
}

TEST(NormErrors, BadInputsNameTheOpAndValues) {
  Graph g;
  auto in = [&](const std::string& n, Shape s, DType d = DType::f32) { return g.input(n, {d, s}); };
  ValueId x1 = in("x1", {8});
  ValueId c3 = in("c3", {3}), c4 = in("c4", {4});
  ValueId x4 = in("x4", {2, 3, 4, 4});
  expect_error(
      [&] {
        g.apply("batch_norm", {x1, c3, c3, c3, c3});
      },
      {"batch_norm", "rank >= 2", "f32[8]"});
  expect_error(
      [&] {
        g.apply("batch_norm", {x4, c4, c3, c3, c3});
      },
      {"batch_norm", "input 1 must be [3]", "f32[4]"});
  expect_error(
      [&] {
        g.apply("batch_norm", {x4, c3, c3, c3, c3}, {{"eps", 0.0}});
      },
      {"batch_norm", "'eps' = 0"});
  expect_error(
      [&] {
        g.apply("batch_norm", {x4, c3, c3, c3, c3}, {{"momentum", 1.5}});
      },
      {"batch_norm", "'momentum' = 1.5"});
  ValueId c3d = in("c3d", {3}, DType::f64);
  expect_error([&] { g.apply("batch_norm", {x4, c3d, c3, c3, c3}); }, {"batch_norm", "f64"});
  expect_error(
      [&] {
        g.apply("layer_norm", {x4, c3, c3});
      },
      {"layer_norm", "input 1 must be [4]", "f32[3]"});
  // One value per channel in training: torch's "Expected more than 1 value per channel".
  BnGraph b({1, 3}, {1, 1, 1}, {0, 0, 0});
  expect_error(
      [&] {
        b.run(Tensor::from_doubles({1, 3}, {1, 2, 3}, DType::f32));
      },
      {"batch_norm", "more than 1 value per channel", "f32[1, 3]"});
}

}  // namespace
}  // namespace qg
