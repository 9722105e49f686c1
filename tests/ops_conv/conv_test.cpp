// conv2d and its backward ops on the CPU: hand-computed small cases, the im2col kernels
// against a direct loop-over-every-tap reference (conv_reference.h) for strides, padding,
// dilation and groups, the backward rule through autograd, and every bad input's error.
#include <gtest/gtest.h>

#include <random>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/ops_conv/conv_reference.h"

namespace qg {
namespace {

using testing::ConvCase;
using testing::expect_error;
using testing::run_op;

Attrs attrs_of(const ConvCase& k) {
  return {{"stride", {k.sh, k.sw}},
          {"padding", {k.ph, k.pw}},
          {"dilation", {k.dh, k.dw}},
          {"groups", k.groups}};
}

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& e : v) e = u(rng);
  return v;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " [" << i << "]";
}

Tensor f64(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::f64);
}

TEST(Conv2d, Stride2Padding1HandValues) {
  // x = 1..9 in a 3x3 image, w = [[1, 2], [3, 4]], stride 2, padding 1: Ho = Wo = 2 and the
  // four windows of the zero-padded 5x5 image are [0 0; 0 1], [0 0; 2 3], [0 4; 0 7],
  // [5 6; 8 9], so y = 4, 3*2 + 4*3, 2*4 + 4*7, 5 + 12 + 24 + 36 (+ bias 0.5).
  Tensor x = f64({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = f64({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor b = f64({1}, {0.5});
  Attrs a = {{"stride", {2, 2}}, {"padding", {1, 1}}};
  auto y = run_op(Device::cpu(), "conv2d", {x, w, b}, a);
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{4.5, 18.5, 36.5, 77.5}));
  // dy = 1: the windows do not overlap, so each pixel gets the one tap that reads it
  // (padded row/column parity picks the tap); dw[i][j] sums the pixels under tap (i, j).
  Tensor dy = f64({1, 1, 2, 2}, {1, 1, 1, 1});
  Attrs ai = a, aw = a;
  ai.set("input_shape", Shape{1, 1, 3, 3});
  aw.set("weight_shape", Shape{1, 1, 2, 2});
  EXPECT_EQ(run_op(Device::cpu(), "conv2d_backward_input", {dy, w}, ai)[0].to_doubles(),
            (std::vector<double>{4, 3, 4, 2, 1, 2, 4, 3, 4}));
  EXPECT_EQ(run_op(Device::cpu(), "conv2d_backward_weight", {dy, x}, aw)[0].to_doubles(),
            (std::vector<double>{5, 10, 10, 20}));
  EXPECT_EQ(run_op(Device::cpu(), "conv2d_backward_bias", {dy})[0].to_doubles(),
            (std::vector<double>{4}));
}

TEST(Conv2d, DepthwiseKeepsChannelsApart) {
  // groups = C = 2: channel 0 with the diagonal kernel gives 1 + 4, channel 1 with the
  // all-ones kernel gives 10 + 20 + 30 + 40; the bias adds 0 and 1.
  Tensor x = f64({1, 2, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  Tensor w = f64({2, 1, 2, 2}, {1, 0, 0, 1, 1, 1, 1, 1});
  Tensor b = f64({2}, {0, 1});
  auto y = run_op(Device::cpu(), "conv2d", {x, w, b}, {{"groups", 2}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{5, 101}));
}

TEST(Conv2d, Dilation2ReadsEveryOtherPixel) {
  // A 2x2 kernel with dilation 2 spans 3x3: taps on pixels 1, 3, 7, 9.
  Tensor x = f64({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = f64({1, 1, 2, 2}, {1, 2, 3, 4});
  auto y = run_op(Device::cpu(), "conv2d", {x, w, f64({1}, {0})}, {{"dilation", {2, 2}}});
  EXPECT_EQ(y[0].shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{1 * 1 + 2 * 3 + 3 * 7 + 4 * 9}));
}

std::vector<ConvCase> reference_cases() {
  std::vector<ConvCase> cases;
  cases.push_back({2, 3, 7, 6, 4, 3, 3});
  ConvCase strided{2, 2, 9, 8, 3, 3, 2, 2, 3, 1, 0};
  cases.push_back(strided);
  ConvCase dilated{1, 2, 9, 9, 2, 3, 3, 1, 1, 2, 2, 2, 3};
  cases.push_back(dilated);
  ConvCase grouped{3, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2};
  cases.push_back(grouped);
  ConvCase depthwise{2, 3, 8, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 3};
  cases.push_back(depthwise);
  ConvCase pointwise{2, 4, 5, 5, 3, 1, 1};
  cases.push_back(pointwise);
  ConvCase everything{2, 6, 11, 10, 4, 3, 2, 2, 3, 2, 1, 2, 3, 2};
  cases.push_back(everything);
  return cases;
}

TEST(Conv2d, MatchesDirectReferenceForwardAndBackward) {
  uint32_t seed = 1;
  for (const ConvCase& k : reference_cases()) {
    SCOPED_TRACE("case with groups " + std::to_string(k.groups) + ", kernel " +
                 std::to_string(k.kh) + "x" + std::to_string(k.kw));
    Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c / k.groups, k.kh, k.kw}, ys{k.n, k.o, k.ho(), k.wo()};
    auto xv = random_values(shape_numel(xs), seed++), wv = random_values(shape_numel(ws), seed++);
    auto bv = random_values(k.o, seed++), dyv = random_values(shape_numel(ys), seed++);
    for (DType dt : {DType::f64, DType::f32}) {
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      auto t = [&](const Shape& s, const std::vector<double>& v) {
        return Tensor::from_doubles(s, v, dt);
      };
      Attrs a = attrs_of(k);
      auto y = run_op(Device::cpu(), "conv2d", {t(xs, xv), t(ws, wv), t({k.o}, bv)}, a);
      ASSERT_EQ(y[0].shape(), ys);
      expect_near_all(y[0].to_doubles(), testing::conv_ref(k, xv, wv, bv), tol, "y");
      Attrs ai = a, aw = a;
      ai.set("input_shape", xs);
      aw.set("weight_shape", ws);
      auto dx = run_op(Device::cpu(), "conv2d_backward_input", {t(ys, dyv), t(ws, wv)}, ai);
      expect_near_all(dx[0].to_doubles(), testing::conv_dx_ref(k, dyv, wv), tol, "dx");
      auto dw = run_op(Device::cpu(), "conv2d_backward_weight", {t(ys, dyv), t(xs, xv)}, aw);
      expect_near_all(dw[0].to_doubles(), testing::conv_dw_ref(k, dyv, xv), tol, "dw");
      auto db = run_op(Device::cpu(), "conv2d_backward_bias", {t(ys, dyv)});
      expect_near_all(db[0].to_doubles(), testing::conv_db_ref(k, dyv), tol, "db");
    }
  }
}

TEST(Conv2d, BackwardRuleEmitsOnlyTheNeededOps) {
  // A zero-constant bias (no bias) gets no gradient node; x and w get theirs.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {1, 2, 5, 5}});
  ValueId w = g.parameter("w", Tensor::zeros({3, 2, 3, 3}, DType::f32));
  ValueId b = g.constant(Tensor::zeros({3}, DType::f32));
  ValueId y = g.apply1("conv2d", {x, w, b}, {{"padding", {1, 1}}});
  ValueId loss = g.apply1("sum", {y});
  auto grads = grad(g, loss, {x, w});
  ASSERT_EQ(grads.size(), 2u);
  int input_ops = 0, weight_ops = 0, bias_ops = 0;
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    const std::string& op = g.node(n).op->name;
    input_ops += op == "conv2d_backward_input";
    weight_ops += op == "conv2d_backward_weight";
    bias_ops += op == "conv2d_backward_bias";
  }
  EXPECT_EQ(input_ops, 1);
  EXPECT_EQ(weight_ops, 1);
  EXPECT_EQ(bias_ops, 0);
  EXPECT_EQ(g.value(grads[0]).type.shape, (Shape{1, 2, 5, 5}));
  EXPECT_EQ(g.value(grads[1]).type.shape, (Shape{3, 2, 3, 3}));
}

// Builds conv2d on inputs of the given types; the errors come from shape inference.
void apply_conv(const TensorType& x, const TensorType& w, const TensorType& b,
                const Attrs& attrs = {}) {
  Graph g;
  g.apply1("conv2d", {g.input("x", x), g.input("w", w), g.input("b", b)}, attrs);
}

const TensorType kX{DType::f32, {1, 4, 6, 6}};
const TensorType kW{DType::f32, {2, 4, 3, 3}};
const TensorType kB{DType::f32, {2}};

TEST(Conv2dErrors, RankNot4NamesTheLayoutAndShape) {
  expect_error(
      [] {
        apply_conv({DType::f32, {4, 6, 6}}, kW, kB);
      },
      {"conv2d", "rank 4", "NCHW", "[4, 6, 6]"});
  expect_error(
      [] {
        apply_conv(kX, {DType::f32, {2, 4, 3}}, kB);
      },
      {"conv2d", "weight w", "[2, 4, 3]"});
}

TEST(Conv2dErrors, NhwcInputIsAChannelMismatch) {
  // An NHWC tensor [1, 6, 6, 4] is read as C = 6.
  expect_error(
      [] {
        apply_conv({DType::f32, {1, 6, 6, 4}}, kW, kB);
      },
      {"conv2d", "channel mismatch", "[1, 6, 6, 4]", "NCHW", "C = 6", "= 4"});
  expect_error(
      [] {
        apply_conv(kX, {DType::f32, {2, 1, 3, 3}}, kB, {{"groups", 2}});
      },
      {"conv2d", "channel mismatch", "groups = 2", "w.shape[1] * groups = 2"});
}

TEST(Conv2dErrors, GroupsMustDivideBothChannelCounts) {
  expect_error(
      [] {
        apply_conv(kX, {DType::f32, {3, 1, 3, 3}}, kB, {{"groups", 3}});
      },
      {"conv2d", "'groups' = 3", "input channels C = 4"});
  expect_error(
      [] {
        apply_conv(kX, {DType::f32, {3, 2, 3, 3}}, {DType::f32, {3}}, {{"groups", 2}});
      },
      {"conv2d", "'groups' = 2", "output channels O = 3"});
  expect_error([] { apply_conv(kX, kW, kB, {{"groups", 0}}); }, {"conv2d", "'groups' = 0"});
}

TEST(Conv2dErrors, KernelLargerThanPaddedInput) {
  expect_error(
      [] {
        apply_conv(kX, {DType::f32, {2, 4, 7, 3}}, kB);
      },
      {"conv2d", "kernel 7x3", "larger than the padded input 6x6"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"dilation", {3, 1}}});
      },
      {"conv2d", "spanning 7x3", "padded input 6x6", "dilation [3, 1]"});
  apply_conv(kX, {DType::f32, {2, 4, 7, 3}}, kB, {{"padding", {1, 0}}});  // 8 rows: fits
}

TEST(Conv2dErrors, BadIntAttributes) {
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"padding", {-1, 0}}});
      },
      {"conv2d", "'padding' = [-1, 0]", "non-negative"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"stride", {0, 1}}});
      },
      {"conv2d", "'stride' = [0, 1]", "positive"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"stride", {1, -2}}});
      },
      {"conv2d", "'stride' = [1, -2]", "positive"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"dilation", {0, 0}}});
      },
      {"conv2d", "'dilation' = [0, 0]", "positive"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"dilation", {1, -1}}});
      },
      {"conv2d", "'dilation' = [1, -1]", "positive"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"stride", {1, 1, 1}}});
      },
      {"conv2d", "'stride' must have 2 values", "got 3", "[1, 1, 1]"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"padding", {1}}});
      },
      {"conv2d", "'padding' must have 2 values", "got 1"});
  expect_error(
      [] {
        apply_conv(kX, kW, kB, {{"dilation", std::vector<int64_t>{}}});
      },
      {"conv2d", "'dilation' must have 2 values", "got 0"});
}

TEST(Conv2dErrors, BiasShapeAndDtypes) {
  expect_error(
      [] {
        apply_conv(kX, kW, {DType::f32, {3}});
      },
      {"conv2d", "bias b", "[O] = [2]", "f32[3]"});
  expect_error([] { apply_conv(kX, kW, {DType::f32, {1, 2}}); }, {"conv2d", "bias b", "[1, 2]"});
  expect_error(
      [] {
        apply_conv(kX, {DType::f64, {2, 4, 3, 3}}, kB);
      },
      {"conv2d", "dtype mismatch", "x f32[1, 4, 6, 6]", "w f64[2, 4, 3, 3]"});
  expect_error(
      [] {
        apply_conv(kX, kW, {DType::f64, {2}});
      },
      {"conv2d", "dtype mismatch", "b f64[2]"});
  expect_error(
      [] {
        apply_conv({DType::i32, {1, 4, 6, 6}}, {DType::i32, {2, 4, 3, 3}}, {DType::i32, {2}});
      },
      {"conv2d", "f32 or f64", "i32"});
}

TEST(Conv2dErrors, BackwardOpsCheckTheirShapes) {
  Graph g;
  ValueId dy = g.input("dy", {DType::f32, {1, 2, 4, 4}});
  ValueId w = g.input("w", {DType::f32, {2, 4, 3, 3}});
  ValueId x = g.input("x", {DType::f32, {1, 4, 6, 6}});
  // Consistent: dx is [1, 4, 6, 6], dw [2, 4, 3, 3], db [2].
  EXPECT_EQ(g.value(g.apply1("conv2d_backward_input", {dy, w}, {{"input_shape", {1, 4, 6, 6}}}))
                .type.shape,
            (Shape{1, 4, 6, 6}));
  EXPECT_EQ(g.value(g.apply1("conv2d_backward_weight", {dy, x}, {{"weight_shape", {2, 4, 3, 3}}}))
                .type.shape,
            (Shape{2, 4, 3, 3}));
  EXPECT_EQ(g.value(g.apply1("conv2d_backward_bias", {dy})).type.shape, (Shape{2}));
  expect_error(
      [&] {
        g.apply1("conv2d_backward_input", {dy, w}, {{"input_shape", {1, 4, 7, 7}}});
      },
      {"conv2d_backward_input", "dy has shape [1, 2, 4, 4]", "output is [1, 2, 5, 5]"});
  expect_error(
      [&] {
        g.apply1("conv2d_backward_input", {dy, w}, {{"input_shape", {1, 4, 6}}});
      },
      {"conv2d_backward_input", "'input_shape' must have 4 values", "got 3"});
  expect_error(
      [&] {
        g.apply1("conv2d_backward_input", {dy, w});
      },
      {"conv2d_backward_input", "required attribute 'input_shape'"});
  expect_error(
      [&] {
        g.apply1("conv2d_backward_weight", {dy, x},
                 {{"weight_shape", {2, 4, 3, 3}}, {"stride", {2, 2}}});
      },
      {"conv2d_backward_weight", "dy has shape [1, 2, 4, 4]", "output is [1, 2, 2, 2]"});
  ValueId dy3 = g.input("dy3", {DType::f32, {2, 4, 4}});
  expect_error([&] { g.apply1("conv2d_backward_bias", {dy3}); },
               {"conv2d_backward_bias", "rank 4", "NCHW", "[2, 4, 4]"});
}

}  // namespace
}  // namespace qg
