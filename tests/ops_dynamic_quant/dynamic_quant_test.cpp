// dynamic_range_quantize: hand-checked scales, zero points and codes for every scope and both
// modes, all-zero scopes, non-finite values, 16-bit inputs, empty tensors and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::build_op;
using testing::expect_error;
using testing::f32;
using testing::run_op;

const double kInf = std::numeric_limits<double>::infinity();
const Attrs kRange4 = {{"quant_min", -4}, {"quant_max", 4}};  // scale = amax / 4

std::vector<Tensor> dyn(const Tensor& x, Attrs a = {}) {
  return run_op("dynamic_range_quantize", {x}, a);
}

TEST(DynamicQuant, SymmetricPerTensorDefaultRange) {
  // Default [-127, 127]: amax 127 -> scale 1; -63.5 ties to -64, 0.5 to 0, 1.5 to 2.
  auto out = dyn(f32({5}, {127, -63.5, 0.5, 1.5, -0.0}));
  EXPECT_EQ(out[0].dtype(), DType::i8);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{127, -64, 0, 2, 0}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1}));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0}));
  EXPECT_EQ(out[1].shape(), (Shape{1}));
}

TEST(DynamicQuant, SymmetricCustomRangePerTensor) {
  // amax 2, qmax 4 -> scale 0.5 (inv 2): 1 -> 2, -2 -> -4, 0.25 -> 0.5 -> 0, 0.75 -> 1.5 -> 2.
  auto out = dyn(f32({5}, {1, -2, 0.25, 0.75, 0}), kRange4);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{2, -4, 0, 2, 0}));
  EXPECT_EQ(out[1].at(0), 0.5);
}

TEST(DynamicQuant, AffinePerChannelU8) {
  // Axis 1 of [2, 2], range [0, 255]. Column 0: [-1, 254] -> scale 255 / 255 = 1,
  // zp = 0 - rint(-1 / 1) = 1, codes [0, 255]. Column 1: [0.5, 127.5] extended to 0 ->
  // scale 0.5, zp 0, codes [1, 255].
  Attrs a = {{"mode", "affine"},
             {"signed", false},
             {"narrow_range", false},
             {"scope", "channel"},
             {"axis", 1}};
  auto out = dyn(f32({2, 2}, {-1, 0.5, 254, 127.5}), a);
  EXPECT_EQ(out[0].dtype(), DType::u8);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 1, 255, 255}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 0.5}));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{1, 0}));
}

TEST(DynamicQuant, AffineSignedRange) {
  // [-128, 127] affine: x in [0, 255] -> scale 1, zp = -128 - rint(0) = -128.
  auto out = dyn(f32({3}, {0, 100, 255}), {{"mode", "affine"}, {"narrow_range", false}});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-128, -28, 127}));
  EXPECT_EQ(out[2].at(0), -128);
}

TEST(DynamicQuant, PerTokenWithAllZeroRow) {
  // Row 0 all zero: scale 1, codes 0. Row 1: amax 8 -> scale 2 (qmax 4).
  auto out = dyn(f32({2, 3}, {0, -0.0, 0, 8, -3, 1}),
                 {{"scope", "token"}, {"quant_min", -4}, {"quant_max", 4}});
  EXPECT_EQ(out[1].shape(), (Shape{2, 1}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 2}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 0, 0, 4, -2, 0}));  // -1.5 -> -2, 0.5 -> 0
  // Affine: the all-zero row gets zp 0 as well, so its codes are 0.
  out = dyn(f32({2, 2}, {0, 0, 1, 2}),
            {{"scope", "token"}, {"mode", "affine"}, {"narrow_range", false}});
  EXPECT_EQ(out[1].at(0), 1.0);
  EXPECT_EQ(out[2].at(0), 0);
  EXPECT_EQ(out[0].at(0), 0);
}

TEST(DynamicQuant, PerGroupWithTail) {
  // [1, 5], groups of 2 along axis 1: {1, -2} amax 2 -> 0.5; {0.5, 0.25} -> 0.125; tail {3} ->
  // 0.75 (3 * (1 / 0.75) rounds to 4).
  auto out = dyn(
      f32({1, 5}, {1, -2, 0.5, 0.25, 3}),
      {{"scope", "group"}, {"axis", 1}, {"group_size", 2}, {"quant_min", -4}, {"quant_max", 4}});
  EXPECT_EQ(out[1].shape(), (Shape{1, 3}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{0.5, 0.125, 0.75}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{2, -4, 4, 2, 4}));
}

TEST(DynamicQuant, NonFiniteValuesAreSkippedByTheReduction) {
  // amax over finite values = 2 -> scale 0.5; NaN -> zp, +/-Inf -> the end codes.
  auto out = dyn(f32({5}, {std::nan(""), kInf, -kInf, 2, -1}), kRange4);
  EXPECT_EQ(out[1].at(0), 0.5);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 4, -4, 4, -2}));
  // A scope with no finite value: scale 1, zp 0.
  out = dyn(f32({2, 2}, {std::nan(""), kInf, 1, 2}),
            {{"scope", "token"}, {"quant_min", -4}, {"quant_max", 4}});
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 0.5}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 4, 2, 4}));
  // Affine: NaN -> the scope's zero point.
  out = dyn(f32({3}, {std::nan(""), -1, 254}),
            {{"mode", "affine"}, {"signed", false}, {"narrow_range", false}});
  EXPECT_EQ(out[2].at(0), 1);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1, 0, 255}));
}

TEST(DynamicQuant, DegenerateRanges) {
  // A subnormal amax makes 1 / scale overflow: treated as all zero (scale 1, codes 0).
  auto out = dyn(f32({2}, {1e-44, -1e-45}));
  EXPECT_EQ(out[1].at(0), 1.0);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 0}));
  // An affine range wider than f32 is an error, not a silent inf scale.
  expect_error(
      [] {
        dyn(f32({2}, {-3e38, 3e38}), {{"mode", "affine"}});
      },
      {"[dynamic_range_quantize]", "overflows f32"});
  // Symmetric handles the same values: scale = 3e38 / 127.
  out = dyn(f32({2}, {-3e38, 3e38}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-127, 127}));
}

TEST(DynamicQuant, OtherFloatTypes) {
  std::vector<double> xv = {1, -2, 0.5, 0.25, 3, -0.75};
  Attrs a = {{"scope", "channel"}, {"axis", 0}};
  auto ref = dyn(f32({2, 3}, xv), a);
  for (DType d : {DType::f16, DType::bf16, DType::f64}) {
    auto out = dyn(Tensor::from_doubles({2, 3}, xv, d), a);
    EXPECT_EQ(out[0].to_doubles(), ref[0].to_doubles()) << dtype_name(d);
    EXPECT_EQ(out[1].to_doubles(), ref[1].to_doubles()) << dtype_name(d);
    EXPECT_EQ(out[1].dtype(), DType::f32);
  }
}

TEST(DynamicQuant, EmptyTensorsFlowThrough) {
  auto out = dyn(f32({0, 3}, {}), {{"scope", "channel"}, {"axis", 1}});
  EXPECT_EQ(out[0].shape(), (Shape{0, 3}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0, 0, 0}));
  out = dyn(f32({0}, {}));
  EXPECT_EQ(out[0].numel(), 0);
  EXPECT_EQ(out[1].at(0), 1.0);
}

TEST(DynamicQuant, BadInput) {
  TensorType x{DType::f32, {2, 3}};
  const char* op = "dynamic_range_quantize";
  expect_error(
      [&] {
        build_op(op, {x}, {{"scope", "channel"}, {"axis", 5}});
      },
      {"[dynamic_range_quantize]", "'axis' = 5", "out of range"});
  expect_error(
      [&] {
        build_op(op, {x}, {{"scope", "group"}, {"group_size", 0}});
      },
      {"'group_size' = 0"});
  expect_error([&] { build_op(op, {x}, {{"bits", 9}}); }, {"'bits' = 9", "exceeds 8"});
  expect_error([&] { build_op(op, {x}, {{"bits", 17}}); }, {"'bits' = 17"});
  expect_error(
      [&] {
        build_op(op, {x}, {{"quant_min", 5}, {"quant_max", -5}});
      },
      {"quant_min = 5", "quant_max = -5"});
  expect_error([&] { build_op(op, {x}, {{"signed", false}}); }, {"'mode' = symmetric", "[0, 255]"});
  expect_error(
      [&] {
        build_op(op, {x}, {{"mode", "affine"}, {"signed", false}, {"out_dtype", "i8"}});
      },
      {"'out_dtype' = i8"});
  expect_error([&] { build_op(op, {x}, {{"mode", "minmax"}}); }, {"'mode' = \"minmax\""});
  expect_error([&] { build_op(op, {{DType::i32, {2, 3}}}); }, {"floating point", "i32[2, 3]"});
}

}  // namespace
}  // namespace qg
