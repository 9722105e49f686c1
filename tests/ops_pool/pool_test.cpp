// Pooling ops on small inputs whose expected values are worked out by hand in the comments,
// the ceil_mode and padding rules of PyTorch, their gradients through grad(), and one test
// per bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;

std::vector<Tensor> cpu_run(const std::string& op, const std::vector<Tensor>& in,
                            const Attrs& attrs = {}) {
  return testing::run_op(Device::cpu(), op, in, attrs);
}

Tensor iota(const Shape& shape, double start = 1.0) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<double>(i);
  return Tensor::from_doubles(shape, v, DType::f32);
}

std::vector<double> ints_of(const Tensor& t) {
  return t.to_doubles();
}

TEST(MaxPool2d, TwoByTwoBlocksWithIndices) {
  // Blocks {1,5,3,4} {2,0,8,7} {9,6,12,15} {10,11,14,13}: maxima 5 (cell 1), 8 (cell 6),
  // 15 (cell 13), 14 (cell 14); stride defaults to the kernel.
  Tensor x = Tensor::from_doubles(
      {1, 1, 4, 4}, {1, 5, 2, 0, 3, 4, 8, 7, 9, 6, 10, 11, 12, 15, 14, 13}, DType::f32);
  auto out = cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{5, 8, 15, 14}));
  EXPECT_EQ(out[1].dtype(), DType::i64);
  EXPECT_EQ(ints_of(out[1]), (std::vector<double>{1, 6, 13, 14}));
}

TEST(MaxPool2d, PaddingIsMinusInfinity) {
  // All values negative: a zero padding would win; -inf padding never does. With kernel 2,
  // stride 1, padding 1 the 3 x 3 output's corners see one cell each.
  Tensor x = Tensor::from_doubles({1, 1, 2, 2}, {-1, -2, -3, -4}, DType::f32);
  auto out =
      cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}, {"stride", {1, 1}}, {"padding", {1, 1}}});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-1, -1, -2, -1, -1, -2, -3, -3, -4}));
  EXPECT_EQ(ints_of(out[1]), (std::vector<double>{0, 0, 1, 0, 0, 1, 2, 2, 3}));
}

TEST(MaxPool2d, CeilModeKeepsPartialWindows) {
  // 3 x 3 input 1..9, kernel 2 stride 2: floor mode gives one window (max 5); ceil mode two
  // per axis, the partial ones {3,6}, {7,8}, {9}.
  Tensor x = iota({1, 1, 3, 3});
  auto floor_out = cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}});
  EXPECT_EQ(floor_out[0].to_doubles(), (std::vector<double>{5}));
  auto ceil_out = cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}, {"ceil_mode", true}});
  EXPECT_EQ(ceil_out[0].to_doubles(), (std::vector<double>{5, 6, 8, 9}));
  EXPECT_EQ(ints_of(ceil_out[1]), (std::vector<double>{4, 5, 7, 8}));
}

TEST(MaxPool2d, CeilModeLastWindowMustStartInsideInputOrLeftPadding) {
  // H = 5, kernel 2, stride 2, padding 1: ceil((5 + 2 - 2) / 2) + 1 = 4 windows, but the 4th
  // would start at 6 = H + padding (right padding only), so there are 3.
  Tensor x = iota({1, 1, 5, 5});
  auto out =
      cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 1, 3, 3}));
  // H = 6, kernel 3, stride 2, padding 1: floor gives 3, ceil 4 (the 4th starts at 6 < 7).
  Tensor x6 = iota({1, 1, 6, 6});
  Attrs a = {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}};
  EXPECT_EQ(cpu_run("max_pool2d", {x6}, a)[0].shape(), (Shape{1, 1, 3, 3}));
  a.set("ceil_mode", true);
  EXPECT_EQ(cpu_run("max_pool2d", {x6}, a)[0].shape(), (Shape{1, 1, 4, 4}));
}

TEST(MaxPool2d, DilationSkipsCells) {
  // 1 x 5 row 1..5 as [1,1,1,5], kernel [1,2] dilation [1,2] stride 1: pairs (0,2) (1,3)
  // (2,4) -> 3, 4, 5 at cells 2, 3, 4.
  Tensor x = iota({1, 1, 1, 5});
  auto out =
      cpu_run("max_pool2d", {x}, {{"kernel", {1, 2}}, {"stride", {1, 1}}, {"dilation", {1, 2}}});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(ints_of(out[1]), (std::vector<double>{2, 3, 4}));
}

TEST(MaxPool2d, WindowWithNoInputCellIsMinusInfinityWithoutGradient) {
  // Width 1, kernel [1,2], dilation [1,2], padding [0,1]: each window visits columns -1 and
  // 1, both outside the input. PyTorch's output is -inf with index h * W + 1 (the first cell
  // it would visit); we return the same, and pass no gradient (PyTorch scatters it there).
  Graph g;
  ValueId xv = g.input("x", {DType::f64, {1, 1, 3, 1}});
  ValueId dy = g.input("dy", {DType::f64, {1, 1, 3, 1}});
  auto out =
      g.apply("max_pool2d", {xv},
              {{"kernel", {1, 2}}, {"stride", {1, 1}}, {"padding", {0, 1}}, {"dilation", {1, 2}}});
  ValueId dx = grad_with_seed(g, out[0], dy, {xv})[0];
  Executor ex(g);
  auto got = ex.run({{"x", Tensor::from_doubles({1, 1, 3, 1}, {0, 1, 2}, DType::f64)},
                     {"dy", Tensor::from_doubles({1, 1, 3, 1}, {1, 1, 1}, DType::f64)}},
                    {out[0], out[1], dx});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>(3, -INFINITY)));
  EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(got[2].to_doubles(), (std::vector<double>{0, 0, 0}));
}

TEST(MaxPool2d, NaNPropagatesAndTheLastNaNIsTheIndex) {
  // PyTorch's rule: a NaN replaces the running maximum, so the window's last NaN wins.
  Tensor x = Tensor::from_doubles({1, 1, 2, 2}, {1, NAN, 3, NAN}, DType::f32);
  auto out = cpu_run("max_pool2d", {x}, {{"kernel", {2, 2}}});
  EXPECT_TRUE(std::isnan(out[0].at(0)));
  EXPECT_EQ(out[1].at(0), 3);
}

TEST(MaxPool2d, BackwardScattersAndSumsOverlappingWindows) {
  // 3 x 3 with the maximum 9 in the centre, kernel 2 stride 1: all four windows pick cell 4,
  // so dx[4] = 1 + 2 + 3 + 4 = 10 and every other cell gets 0.
  Tensor x = Tensor::from_doubles({1, 1, 3, 3}, {0, 0, 0, 0, 9, 0, 0, 0, 0}, DType::f64);
  Graph g;
  ValueId xv = g.input("x", {DType::f64, {1, 1, 3, 3}});
  ValueId dy = g.input("dy", {DType::f64, {1, 1, 2, 2}});
  ValueId y = g.apply("max_pool2d", {xv}, {{"kernel", {2, 2}}, {"stride", {1, 1}}})[0];
  ValueId dx = grad_with_seed(g, y, dy, {xv})[0];
  Executor ex(g);
  auto got = ex.run(
      {{"x", x}, {"dy", Tensor::from_doubles({1, 1, 2, 2}, {1, 2, 3, 4}, DType::f64)}}, {dx});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{0, 0, 0, 0, 10, 0, 0, 0, 0}));
}

TEST(AvgPool2d, PlainWindows) {
  // 3 x 3 input 1..9, kernel 2 stride 1: (1+2+4+5)/4 = 3, then 4, 6, 7.
  auto out = cpu_run("avg_pool2d", {iota({1, 1, 3, 3})}, {{"kernel", {2, 2}}, {"stride", {1, 1}}});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{3, 4, 6, 7}));
}

TEST(AvgPool2d, CountIncludePad) {
  // [[1,2],[3,4]], kernel 2, stride 2, padding 1: every window holds one input cell and three
  // padded ones: divisor 4 with count_include_pad, 1 without.
  Tensor x = Tensor::from_doubles({1, 1, 2, 2}, {1, 2, 3, 4}, DType::f32);
  Attrs a = {{"kernel", {2, 2}}, {"padding", {1, 1}}};
  EXPECT_EQ(cpu_run("avg_pool2d", {x}, a)[0].to_doubles(),
            (std::vector<double>{0.25, 0.5, 0.75, 1.0}));
  a.set("count_include_pad", false);
  EXPECT_EQ(cpu_run("avg_pool2d", {x}, a)[0].to_doubles(), (std::vector<double>{1, 2, 3, 4}));
}

TEST(AvgPool2d, CeilModeDivisorStopsAtTheRightPadding) {
  // 3 x 3 input 1..9, kernel 2, stride 2, ceil mode, no padding: partial windows divide by
  // their cells inside the input: 3, (3+6)/2, (7+8)/2, 9/1.
  Attrs a = {{"kernel", {2, 2}}, {"ceil_mode", true}};
  EXPECT_EQ(cpu_run("avg_pool2d", {iota({1, 1, 3, 3})}, a)[0].to_doubles(),
            (std::vector<double>{3, 4.5, 7.5, 9}));
  // Ones 4 x 4, kernel 3, stride 2, padding 1, ceil mode: 3 x 3 outputs. Window (0,0) spans
  // rows/cols -1..1: 4 cells of 9 (4/9 with padding, 1 without). Window (2,2) starts at 3;
  // it is clipped at 4 + 1 = 5: 2 x 2 = 4 cells counted with padding, 1 inside.
  Tensor ones = Tensor::from_doubles({1, 1, 4, 4}, std::vector<double>(16, 1.0), DType::f64);
  Attrs b = {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}};
  auto inc = cpu_run("avg_pool2d", {ones}, b)[0];
  EXPECT_EQ(inc.shape(), (Shape{1, 1, 3, 3}));
  EXPECT_DOUBLE_EQ(inc.at(0), 4.0 / 9.0);
  EXPECT_DOUBLE_EQ(inc.at(8), 1.0 / 4.0);
  b.set("count_include_pad", false);
  auto exc = cpu_run("avg_pool2d", {ones}, b)[0];
  for (double v : exc.to_doubles()) EXPECT_DOUBLE_EQ(v, 1.0);
}

TEST(AvgPool2d, BackwardSharesDyOverEachWindow) {
  // 1 x 3 row, kernel [1,2] stride 1: windows (0,1) and (1,2), dy = (2, 4): dx = (1, 1+2, 2).
  Graph g;
  ValueId xv = g.input("x", {DType::f64, {1, 1, 1, 3}});
  ValueId dy = g.input("dy", {DType::f64, {1, 1, 1, 2}});
  ValueId y = g.apply1("avg_pool2d", {xv}, {{"kernel", {1, 2}}, {"stride", {1, 1}}});
  ValueId dx = grad_with_seed(g, y, dy, {xv})[0];
  Executor ex(g);
  auto got = ex.run(
      {{"x", iota({1, 1, 1, 3})}, {"dy", Tensor::from_doubles({1, 1, 1, 2}, {2, 4}, DType::f64)}},
      {dx});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{1, 3, 2}));
}

TEST(GlobalAvgPool2d, MeanPerPlaneAndBroadcastBackward) {
  // Planes {1,2,3} and {4,5,9}: means 2 and 6; dy = (3, 6) spreads as 1 and 2 per cell.
  Graph g;
  ValueId xv = g.input("x", {DType::f64, {2, 1, 1, 3}});
  ValueId dy = g.input("dy", {DType::f64, {2, 1}});
  ValueId y = g.apply1("global_avg_pool2d", {xv});
  ValueId dx = grad_with_seed(g, y, dy, {xv})[0];
  Executor ex(g);
  auto got = ex.run({{"x", Tensor::from_doubles({2, 1, 1, 3}, {1, 2, 3, 4, 5, 9}, DType::f64)},
                     {"dy", Tensor::from_doubles({2, 1}, {3, 6}, DType::f64)}},
                    {y, dx});
  EXPECT_EQ(got[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{2, 6}));
  EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{1, 1, 1, 2, 2, 2}));
}

void apply_pool(const std::string& op, const Shape& shape, const Attrs& attrs,
                DType dtype = DType::f32) {
  Graph g;
  g.apply(op, {g.input("x", {dtype, shape})}, attrs);
}

TEST(PoolErrors, RankNotFour) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 4, 4}, {{"kernel", {2, 2}}});
      },
      {"[max_pool2d]", "rank 4", "[1, 4, 4]"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {2, 1, 1, 4, 4}, {{"kernel", {2, 2}}});
      },
      {"[avg_pool2d]", "rank 4"});
  expect_error(
      [] {
        apply_pool("global_avg_pool2d", {2, 3}, {});
      },
      {"[global_avg_pool2d]", "rank 4", "[2, 3]"});
}

TEST(PoolErrors, KernelLargerThanPaddedInput) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 2, 2}, {{"kernel", {3, 3}}});
      },
      {"[max_pool2d]", "larger than the padded input", "[3, 3]", "[1, 1, 2, 2]"});
  // Dilation 2 makes a kernel of 2 span 3 cells.
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 2, 5}, {{"kernel", {2, 2}}, {"dilation", {2, 1}}});
      },
      {"[max_pool2d]", "larger than the padded input"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {1, 1, 5, 2}, {{"kernel", {2, 3}}});
      },
      {"[avg_pool2d]", "larger than the padded input", "[2, 3]"});
}

TEST(PoolErrors, PaddingMoreThanHalfTheKernel) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 8, 8}, {{"kernel", {2, 2}}, {"padding", {2, 0}}});
      },
      {"[max_pool2d]", "'padding' = [2, 0]", "kernel / 2", "[2, 2]"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {1, 1, 8, 8}, {{"kernel", {3, 3}}, {"padding", {0, 2}}});
      },
      {"[avg_pool2d]", "'padding' = [0, 2]"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {1, 1, 8, 8}, {{"kernel", {3, 3}}, {"padding", {-1, 0}}});
      },
      {"[avg_pool2d]", "'padding' = [-1, 0]"});
}

TEST(PoolErrors, NonPositiveKernelStrideDilation) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {0, 2}}});
      },
      {"[max_pool2d]", "'kernel' = [0, 2]", "positive"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"stride", {1, -1}}});
      },
      {"[avg_pool2d]", "'stride' = [1, -1]", "positive"});
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"dilation", {0, 1}}});
      },
      {"[max_pool2d]", "'dilation' = [0, 1]", "positive"});
}

TEST(PoolErrors, WrongAttributeLengths) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {2}}});
      },
      {"[max_pool2d]", "'kernel'", "2 values", "[2]"});
  expect_error(
      [] {
        apply_pool("avg_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"stride", {1, 1, 1}}});
      },
      {"[avg_pool2d]", "'stride'", "[1, 1, 1]"});
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}, {"padding", {1}}});
      },
      {"[max_pool2d]", "'padding'", "[1]"});
}

TEST(PoolErrors, NonFloatInputAndBadBackwardShapes) {
  expect_error(
      [] {
        apply_pool("max_pool2d", {1, 1, 4, 4}, {{"kernel", {2, 2}}}, DType::i32);
      },
      {"[max_pool2d]", "floating point", "i32"});
  expect_error(
      [] {
        Graph g;
        ValueId dy = g.input("dy", {DType::f32, {1, 1, 3, 3}});
        g.apply("avg_pool2d_backward", {dy}, {{"kernel", {2, 2}}, {"input_shape", {1, 1, 4, 4}}});
      },
      {"[avg_pool2d_backward]", "[1, 1, 3, 3]", "[1, 1, 2, 2]"});
}

}  // namespace
}  // namespace qg
