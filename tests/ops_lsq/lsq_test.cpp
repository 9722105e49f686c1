// lsq_fake_quantize / lsq_backward: hand-checked forward and gradients (SEMANTICS.md,
// "Learnable fake quantize"), non-finite inputs, 16-bit inputs, empty tensors, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "core/half.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::build_op;
using testing::expect_error;
using testing::f32;
using testing::f64;
using testing::run_op;

// Range [0, 7], scale 0.5, zp 1.4 (-> 1). Codes rint(x * 2) + 1 = [-1, 2, 2, 8]: below, in,
// in (a 0.5 * 2 = 1 exact), above.
const std::vector<double> kX = {-1.0, 0.26, 0.5, 3.6};
const Attrs kRange3 = {{"quant_min", 0}, {"quant_max", 7}, {"grad_factor", 1.0}};

TEST(Lsq, PerTensorForward) {
  for (DType d : {DType::f32, DType::f64}) {
    auto y = run_op("lsq_fake_quantize",
                    {Tensor::from_doubles({4}, kX, d), f32({1}, {0.5}), f32({1}, {1.4})}, kRange3);
    EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{-0.5, 0.5, 0.5, 3.0})) << dtype_name(d);
  }
}

TEST(Lsq, PerTensorBackwardByHand) {
  // dy = [1, 2, 3, 4], grad_factor 1:
  //   e0 below: dscale += 1 * (0 - 1),          dzp += -1 * 0.5
  //   e1 in:    dscale += 2 * (0.5 - 0.26) / 0.5 = 0.96, dx = 2
  //   e2 in:    dscale += 3 * (0.5 - 0.5) / 0.5 = 0,     dx = 3
  //   e3 above: dscale += 4 * (7 - 1) = 24,      dzp += -4 * 0.5
  auto g =
      run_op("lsq_backward",
             {f64({4}, {1, 2, 3, 4}), f64({4}, kX), f64({1}, {0.5}), f64({1}, {1.4})}, kRange3);
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{0, 2, 3, 0}));
  EXPECT_NEAR(g[1].at(0), 23.96, 1e-12);
  EXPECT_EQ(g[2].at(0), -2.5);
  EXPECT_EQ(g[1].dtype(), DType::f64);
}

TEST(Lsq, DefaultGradFactorIsInverseSqrtNumelQmax) {
  Attrs a = {{"quant_min", 0}, {"quant_max", 7}};
  auto g = run_op("lsq_backward",
                  {f64({4}, {1, 2, 3, 4}), f64({4}, kX), f64({1}, {0.5}), f64({1}, {1.4})}, a);
  double factor = 1.0 / std::sqrt(4.0 * 7.0);
  EXPECT_NEAR(g[1].at(0), 23.96 * factor, 1e-12);
  EXPECT_NEAR(g[2].at(0), -2.5 * factor, 1e-15);
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{0, 2, 3, 0}));  // dx is not scaled
}

TEST(Lsq, PerChannelLastAxisByHand) {
  // [2, 2], axis -1, 4-bit signed [-8, 7]. Column 0: scale 0.25, zp 0; x 0.375 -> 1.5 -> 2
  // (tie to even), 1.125 -> 4.5 -> 4: both in range. Column 1: scale 1, zp 2.6 -> 3;
  // x -5 -> -2 (in), 5 -> 8 (above, clamps to 7 -> y = 4).
  Attrs a = {
      {"scope", "channel"}, {"axis", -1}, {"bits", 4}, {"signed", true}, {"grad_factor", 1.0}};
  Tensor x = f64({2, 2}, {0.375, -5, 1.125, 5});
  Tensor s = f64({2}, {0.25, 1.0}), z = f64({2}, {0.0, 2.6});
  auto y = run_op("lsq_fake_quantize", {x, s, z}, a);
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{0.5, -5, 1.0, 4}));
  auto g = run_op("lsq_backward", {f64({2, 2}, {1, 2, 3, 4}), x, s, z}, a);
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{1, 2, 3, 0}));
  // Column 0: 1 * (0.5 - 0.375) / 0.25 + 3 * (1.0 - 1.125) / 0.25 = 0.5 - 1.5; column 1: 4 * 4.
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{-1.0, 16.0}));
  EXPECT_EQ(g[2].to_doubles(), (std::vector<double>{0.0, -4.0}));
}

TEST(Lsq, PerChannelMiddleAxisSumsOverOtherAxes) {
  // [2, 2, 2] axis 1: channel c collects elements (o, c, i) for all o, i. Every element lies
  // above the range (x = 100, range [0, 3], scale 1, zp 0): dscale_c = 3 * sum(dy), dzp_c =
  // -sum(dy).
  Attrs a = {
      {"scope", "channel"}, {"axis", 1}, {"quant_min", 0}, {"quant_max", 3}, {"grad_factor", 1.0}};
  Tensor x = f64({2, 2, 2}, std::vector<double>(8, 100.0));
  Tensor dy = f64({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto g = run_op("lsq_backward", {dy, x, f64({2}, {1, 1}), f64({2}, {0, 0})}, a);
  // Channel 0: elements 0, 1, 4, 5 -> dy 1 + 2 + 5 + 6 = 14; channel 1: 3 + 4 + 7 + 8 = 22.
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{42, 66}));
  EXPECT_EQ(g[2].to_doubles(), (std::vector<double>{-14, -22}));
}

TEST(Lsq, PerGroupByHand) {
  // [2, 4], groups of 2 along axis 1, 4-bit signed [-8, 7], zero point 0, grad_factor 1
  // (torchao's range learning). Scales [[0.5, 1], [0.25, 2]]:
  //   row 0, group 0 (0.5): 0.3 -> 0.6 -> 1 (y 0.5); -1.2 -> -2.4 -> -2 (y -1)
  //   row 0, group 1 (1):   7.6 -> 8 above (y 7);    -2.5 -> tie -> -2 (y -2)
  //   row 1, group 0 (0.25): 0.1 -> 0.4 -> 0 (y 0);  -3 -> -12 below (y -2)
  //   row 1, group 1 (2):   3 -> 1.5 -> 2 (y 4);     -1 -> -0.5 -> -0 (y -0)
  Attrs a = {{"scope", "group"}, {"axis", 1},      {"group_size", 2},
             {"bits", 4},        {"signed", true}, {"grad_factor", 1.0}};
  Tensor x = f64({2, 4}, {0.3, -1.2, 7.6, -2.5, 0.1, -3, 3, -1});
  Tensor s = f64({2, 2}, {0.5, 1, 0.25, 2}), z = f64({2, 2}, {0, 0, 0, 0});
  auto y = run_op("lsq_fake_quantize", {x, s, z}, a);
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{0.5, -1, 7, -2, 0, -2, 4, 0}));
  auto g = run_op("lsq_backward", {f64({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}), x, s, z}, a);
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{1, 2, 0, 4, 5, 0, 7, 8}));
  // dscale: (0, 0) 1 * 0.2 / 0.5 + 2 * 0.2 / 0.5 = 1.2; (0, 1) 3 * 7 + 4 * 0.5 = 23;
  // (1, 0) 5 * -0.1 / 0.25 + 6 * -8 = -50; (1, 1) 7 * 1 / 2 + 8 * 1 / 2 = 7.5.
  const std::vector<double> ds = g[1].to_doubles(), want = {1.2, 23, -50, 7.5};
  ASSERT_EQ(g[1].shape(), (Shape{2, 2}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(ds[i], want[i], 1e-12) << i;
  // dzero_point: -dy * scale for the out-of-range elements only.
  EXPECT_EQ(g[2].to_doubles(), (std::vector<double>{0, -3, -1.5, 0}));
}

TEST(Lsq, PerGroupEqualsPerChannelOverTheGroups) {
  // Groups of g along the last axis of [rows, in] are the channels (axis 0) of the same data
  // viewed as [rows * in / g, g]: forward and gradients bit for bit.
  const int64_t rows = 3, in = 8, gs = 4;
  std::vector<double> xv, dyv, sv;
  for (int64_t i = 0; i < rows * in; ++i) {
    xv.push_back(std::sin(0.7 * static_cast<double>(i)) * 2.5);
    dyv.push_back(std::cos(1.3 * static_cast<double>(i)));
  }
  for (int64_t i = 0; i < rows * in / gs; ++i) sv.push_back(0.15 + 0.05 * static_cast<double>(i));
  const Attrs range = {{"bits", 4}, {"signed", true}, {"grad_factor", 1.0}};
  Attrs group = range, channel = range;
  group.set("scope", "group");
  group.set("axis", 1);
  group.set("group_size", gs);
  channel.set("scope", "channel");
  channel.set("axis", 0);
  const std::vector<double> zeros(sv.size(), 0.0);
  auto yg =
      run_op("lsq_fake_quantize",
             {f32({rows, in}, xv), f32({rows, in / gs}, sv), f32({rows, in / gs}, zeros)}, group);
  auto yc = run_op(
      "lsq_fake_quantize",
      {f32({rows * in / gs, gs}, xv), f32({rows * in / gs}, sv), f32({rows * in / gs}, zeros)},
      channel);
  EXPECT_EQ(yg[0].to_doubles(), yc[0].to_doubles());
  auto gg = run_op("lsq_backward",
                   {f32({rows, in}, dyv), f32({rows, in}, xv), f32({rows, in / gs}, sv),
                    f32({rows, in / gs}, zeros)},
                   group);
  auto gc = run_op("lsq_backward",
                   {f32({rows * in / gs, gs}, dyv), f32({rows * in / gs, gs}, xv),
                    f32({rows * in / gs}, sv), f32({rows * in / gs}, zeros)},
                   channel);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(gg[k].to_doubles(), gc[k].to_doubles()) << k;
}

TEST(Lsq, ZeroPointIsRoundedHalfEvenAndClamped) {
  // zp 2.5 -> 2 (ties to even); zp 300 -> 255 and zp -7 -> 0 for the default u8 range.
  Tensor x = f32({1}, {0.0});
  EXPECT_EQ(run_op("lsq_fake_quantize", {x, f32({1}, {1}), f32({1}, {2.5})})[0].at(0), 0.0);
  auto y = run_op("lsq_fake_quantize", {f32({2}, {-300, 1}), f32({1}, {1}), f32({1}, {300})});
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{-255, 0}));
  y = run_op("lsq_fake_quantize", {f32({2}, {-3, 300}), f32({1}, {1}), f32({1}, {-7})});
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{0, 255}));
  // Backward uses the same clamped zp: x = 300 is above, dscale = dy * (255 - 255) = 0.
  auto g = run_op("lsq_backward", {f32({1}, {1}), f32({1}, {300}), f32({1}, {1}), f32({1}, {300})},
                  {{"grad_factor", 1.0}});
  EXPECT_EQ(g[1].at(0), 0.0);
  EXPECT_EQ(g[2].at(0), -1.0);
}

TEST(Lsq, NonFiniteInputs) {
  // NaN -> NaN with no gradient at all; +/-Inf clamp and count as out of range.
  const double inf = std::numeric_limits<double>::infinity();
  Attrs a = {{"bits", 4}, {"signed", true}, {"grad_factor", 1.0}};
  Tensor x = f32({3}, {std::nan(""), inf, -inf});
  auto y = run_op("lsq_fake_quantize", {x, f32({1}, {1}), f32({1}, {0})}, a);
  EXPECT_TRUE(std::isnan(y[0].at(0)));
  EXPECT_EQ(y[0].at(1), 7.0);
  EXPECT_EQ(y[0].at(2), -8.0);
  auto g = run_op("lsq_backward", {f32({3}, {5, 1, 2}), x, f32({1}, {1}), f32({1}, {0})}, a);
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(g[1].at(0), 1 * 7.0 + 2 * -8.0);
  EXPECT_EQ(g[2].at(0), -3.0);
}

TEST(Lsq, HalfTypesComputeInF32) {
  std::vector<double> xv = {-1.0, 0.25, 0.5, 3.5, 1.75, -0.125};
  Tensor ref =
      run_op("lsq_fake_quantize", {f32({6}, xv), f32({1}, {0.5}), f32({1}, {1})}, kRange3)[0];
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor y =
        run_op("lsq_fake_quantize",
               {Tensor::from_doubles({6}, xv, d), f32({1}, {0.5}), f32({1}, {1})}, kRange3)[0];
    EXPECT_EQ(y.dtype(), d);
    EXPECT_EQ(y.to_doubles(), ref.to_doubles()) << dtype_name(d);
    auto g = run_op("lsq_backward",
                    {Tensor::from_doubles({6}, std::vector<double>(6, 1.0), d),
                     Tensor::from_doubles({6}, xv, d), f32({1}, {0.5}), f32({1}, {1})},
                    kRange3);
    EXPECT_EQ(g[0].dtype(), d);
    EXPECT_EQ(g[1].dtype(), DType::f32);
  }
}

TEST(Lsq, EmptyTensorsFlowThrough) {
  Attrs a = {{"scope", "channel"}, {"axis", 1}};
  Tensor x = f32({0, 3}, {});
  Tensor s = f32({3}, {1, 1, 1}), z = f32({3}, {0, 0, 0});
  EXPECT_EQ(run_op("lsq_fake_quantize", {x, s, z}, a)[0].numel(), 0);
  auto g = run_op("lsq_backward", {x, x, s, z}, a);
  EXPECT_EQ(g[0].numel(), 0);
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(g[2].to_doubles(), (std::vector<double>{0, 0, 0}));
}

TEST(Lsq, AutogradReachesScaleAndZeroPoint) {
  // loss = sum(lsq(x)); the graph gradients equal lsq_backward with dy = 1.
  Graph g;
  ValueId x = g.input("x", {DType::f64, {4}});
  ValueId s = g.input("s", {DType::f64, {1}});
  ValueId z = g.input("z", {DType::f64, {1}});
  ValueId y = g.apply1("lsq_fake_quantize", {x, s, z}, kRange3);
  auto d = grad(g, g.apply1("sum", {y}), {x, s, z});
  Executor exec(g);
  auto got = exec.run({{"x", f64({4}, kX)}, {"s", f64({1}, {0.5})}, {"z", f64({1}, {1.4})}}, d);
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_NEAR(got[1].at(0), -1 + 0.48 + 6, 1e-12);
  EXPECT_EQ(got[2].at(0), -1.0);
}

TEST(Lsq, BadInput) {
  TensorType x{DType::f32, {2, 3}}, s1{DType::f32, {1}}, s3{DType::f32, {3}};
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s3, s3}, {{"scope", "channel"}, {"axis", 2}});
      },
      {"[lsq_fake_quantize]", "'axis' = 2", "out of range"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s3, s3}, {{"scope", "channel"}, {"axis", -3}});
      },
      {"'axis' = -3"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s1}, {{"scope", "token"}});
      },
      {"'scope' = \"token\"", "tensor, channel, group"});
  // Per group: the qparams are [rows, groups] (a shorter last group counts), group_size > 0.
  TensorType s2x2{DType::f32, {2, 2}};
  build_op("lsq_fake_quantize", {x, s2x2, s2x2},
           {{"scope", "group"}, {"axis", 1}, {"group_size", 2}});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s3, s3},
                 {{"scope", "group"}, {"axis", 1}, {"group_size", 2}});
      },
      {"scale has shape [3]", "[2, 2]"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s2x2, s2x2},
                 {{"scope", "group"}, {"axis", 1}, {"group_size", 0}});
      },
      {"'group_size' = 0", "positive"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s1}, {{"bits", 17}});
      },
      {"'bits' = 17", "[2, 16]"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s1}, {{"quant_min", 7}, {"quant_max", 3}});
      },
      {"quant_min = 7", "quant_max = 3"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s3});
      },
      {"zero_point has shape [3]", "[1]"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s3}, {{"scope", "channel"}, {"axis", 1}});
      },
      {"scale has shape [1]", "[3]"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {{DType::i32, {2, 3}}, s1, s1});
      },
      {"floating point", "i32[2, 3]"});
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, {DType::i32, {1}}});
      },
      {"zero_point must be f32 or f64", "learnable"});
  // The default grad_factor needs quant_max > 0.
  expect_error(
      [&] {
        build_op("lsq_fake_quantize", {x, s1, s1}, {{"quant_min", -8}, {"quant_max", -1}});
      },
      {"grad_factor", "quant_max = -1"});
  build_op("lsq_fake_quantize", {x, s1, s1},
           {{"quant_min", -8}, {"quant_max", -1}, {"grad_factor", 0.1}});
  expect_error(
      [&] {
        build_op("lsq_backward", {{DType::f64, {2, 3}}, x, s1, s1});
      },
      {"[lsq_backward]", "dy f64[2, 3] must match x f32[2, 3]"});
  // Values: a non-positive scale and a non-finite zero point fail when run.
  Tensor xv = f32({2}, {1, 2});
  expect_error(
      [&] {
        run_op("lsq_fake_quantize", {xv, f32({1}, {0}), f32({1}, {0})});
      },
      {"scale[0] = 0", "positive and finite"});
  expect_error(
      [&] {
        run_op("lsq_fake_quantize", {xv, f32({1}, {1}), f32({1}, {std::nan("")})});
      },
      {"zero_point[0] = nan", "finite"});
  // Constant qparams are checked at graph-build time.
  Graph g;
  ValueId xi = g.input("x", x);
  ValueId bad = g.constant(f32({1}, {-1}));
  expect_error(
      [&] {
        g.apply("lsq_fake_quantize", {xi, bad, g.constant(f32({1}, {0}))});
      },
      {"scale[0] = -1"});
}

}  // namespace
}  // namespace qg
