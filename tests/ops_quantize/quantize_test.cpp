// quantize / dequantize (and their backward ops): hand-checked codes for every scope, ties,
// far-out-of-range values, +/-0, NaN and Inf, 16-bit inputs, empty tensors, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::build_op;
using testing::expect_error;
using testing::f32;
using testing::f64;
using testing::run_op;

Tensor i32(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::i32);
}

const double kInf = std::numeric_limits<double>::infinity();

TEST(Quantize, PerTensorU8TiesClampAndNonFinite) {
  // scale 1, zp 10: rint ties to even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0), far values
  // clamp, -0 -> zp, NaN -> zp, +/-Inf -> the end codes. Mask: in range only for finite
  // values whose unclamped code fits.
  Tensor x = f32({10}, {0.5, 1.5, 2.5, -0.5, 1e30, -1e30, -0.0, std::nan(""), kInf, -kInf});
  auto out = run_op("quantize", {x, f32({1}, {1}), i32({1}, {10})});
  EXPECT_EQ(out[0].dtype(), DType::u8);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{10, 12, 12, 10, 255, 0, 10, 10, 255, 0}));
  ASSERT_EQ(out[1].numel(), 2);
  EXPECT_EQ(out[1].at(0), 0x4F);  // elements 0-3 and 6 in range
  EXPECT_EQ(out[1].at(1), 0x00);
}

TEST(Quantize, PerChannelI8Axis0) {
  // Row 0: scale 0.5 (inv 2), zp 0: 1.25 -> 2.5 -> 2, -0.25 -> -0.5 -> 0, 100 -> 127 (clamp).
  // Row 1: scale 2 (inv 0.5), zp -3: 3 -> 1.5 -> 2 - 3, -5 -> -2.5 -> -2 - 3, 7 -> 3.5 -> 4 - 3.
  Tensor x = f64({2, 3}, {1.25, -0.25, 100, 3, -5, 7});
  auto out = run_op("quantize", {x, f64({2}, {0.5, 2}), i32({2}, {0, -3})},
                    {{"scope", "channel"}, {"axis", 0}, {"signed", true}});
  EXPECT_EQ(out[0].dtype(), DType::i8);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{2, 0, 127, -1, -5, 1}));
  EXPECT_EQ(out[1].at(0), 0b111011);
}

TEST(Quantize, PerTokenAndPerGroupWithTail) {
  auto tok = run_op("quantize",
                    {f32({2, 2}, {3.4, 0.6, 2.0, 0.2}), f32({2, 1}, {1, 0.5}), i32({2, 1}, {0, 1})},
                    {{"scope", "token"}});
  EXPECT_EQ(tok[0].to_doubles(), (std::vector<double>{3, 1, 5, 1}));
  // Groups of 2 along axis 1 of [1, 5]: {1, 2} scale 1, {3, 4} scale 0.5, tail {5} scale 0.25.
  auto grp =
      run_op("quantize",
             {f32({1, 5}, {1, 2, 3, 4, 5}), f32({1, 3}, {1, 0.5, 0.25}), i32({1, 3}, {0, 0, 0})},
             {{"scope", "group"}, {"axis", 1}, {"group_size", 2}, {"signed", true}});
  EXPECT_EQ(grp[0].to_doubles(), (std::vector<double>{1, 2, 6, 8, 20}));
}

TEST(Quantize, ExplicitDtypeAndNarrowRange) {
  // Narrow signed range [-127, 127] stored as i8: -1000 clamps to -127, not -128.
  auto out = run_op("quantize", {f32({2}, {-1000, 1000}), f32({1}, {1}), i32({1}, {0})},
                    {{"signed", true}, {"narrow_range", true}, {"out_dtype", "i8"}});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-127, 127}));
  // A 4-bit unsigned range in u8 storage.
  out = run_op("quantize", {f32({2}, {-3, 30}), f32({1}, {1}), i32({1}, {2})}, {{"bits", 4}});
  EXPECT_EQ(out[0].dtype(), DType::u8);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0, 15}));
}

TEST(Quantize, HalfTypesComputeInF32) {
  std::vector<double> xv = {0.5, -1.25, 3.75, 100, -0.0, 2.5};
  Tensor ref = run_op("quantize", {f32({6}, xv), f32({1}, {0.5}), i32({1}, {3})})[0];
  for (DType d : {DType::f16, DType::bf16, DType::f64}) {
    auto out =
        run_op("quantize", {Tensor::from_doubles({6}, xv, d), f32({1}, {0.5}), i32({1}, {3})});
    EXPECT_EQ(out[0].to_doubles(), ref.to_doubles()) << dtype_name(d);
  }
}

TEST(Dequantize, PerTensorAndPerChannel) {
  Tensor q = Tensor::from_doubles({3}, {-128, 0, 127}, DType::i8);
  auto y = run_op("dequantize", {q, f32({1}, {0.5}), i32({1}, {-1})});
  EXPECT_EQ(y[0].dtype(), DType::f32);
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{-63.5, 0.5, 64}));
  Tensor qu = Tensor::from_doubles({2, 2}, {0, 255, 128, 130}, DType::u8);
  for (const char* d : {"f32", "f64", "f16", "bf16"}) {
    auto yc = run_op("dequantize", {qu, f64({2}, {0.25, 2}), i32({2}, {128, 129})},
                     {{"scope", "channel"}, {"axis", 1}, {"out_dtype", d}});
    EXPECT_EQ(yc[0].dtype(), dtype_from_name(d));
    EXPECT_EQ(yc[0].to_doubles(), (std::vector<double>{-32, 252, 0, 2})) << d;
  }
}

TEST(Dequantize, TokenAndGroup) {
  Tensor q = Tensor::from_doubles({2, 3}, {1, 2, 3, -1, -2, -3}, DType::i8);
  auto y =
      run_op("dequantize", {q, f32({2, 1}, {1, 0.5}), i32({2, 1}, {1, 0})}, {{"scope", "token"}});
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{0, 1, 2, -0.5, -1, -1.5}));
  // Groups of 2 along axis 0 of [3, 1]: rows {0, 1} and the tail row {2}.
  Tensor qg = Tensor::from_doubles({3, 1}, {4, 8, 8}, DType::u8);
  y = run_op("dequantize", {qg, f32({2, 1}, {0.5, 0.25}), i32({2, 1}, {0, 4})},
             {{"scope", "group"}, {"axis", 0}, {"group_size", 2}});
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{2, 4, 1}));
}

TEST(Quantize, BackwardIsDyOverScaleTimesMask) {
  // Codes (scale 0.5, zp 0, u8): 1 -> 2 (in), -1 -> -2 (out), 200 -> 400 (out), 3 -> 6 (in).
  Tensor x = f64({4}, {1, -1, 200, 3});
  auto fwd = run_op("quantize", {x, f64({1}, {0.5}), i32({1}, {0})});
  auto dx = run_op("quantize_backward", {f64({4}, {1, 2, 3, 4}), fwd[1], f64({1}, {0.5})},
                   {{"dx_dtype", "f64"}});
  EXPECT_EQ(dx[0].to_doubles(), (std::vector<double>{2, 0, 0, 8}));
  // Through the graph: loss = sum(dequantize(quantize(x)) * w) gives dx = w * mask
  // (dy * scale from dequantize, then / scale), and dscale of dequantize = sum(w * (q - zp)).
  Graph g;
  ValueId xi = g.input("x", {DType::f64, {4}});
  ValueId s = g.input("s", {DType::f64, {1}});
  ValueId z = g.input("z", {DType::i32, {1}});
  auto qm = g.apply("quantize", {xi, s, z});
  ValueId y = g.apply1("dequantize", {qm[0], s, z}, {{"out_dtype", "f64"}});
  ValueId w = g.input("w", {DType::f64, {4}});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {y, w})});
  auto d = grad(g, loss, {xi});
  Executor exec(g);
  auto got = exec.run(
      {{"x", x}, {"s", f64({1}, {0.5})}, {"z", i32({1}, {0})}, {"w", f64({4}, {1.5, 2, 3, 4})}}, d);
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{1.5, 0, 0, 4}));
}

TEST(Quantize, BackwardCastsTheIncomingGradientToXsDtype) {
  // x in f16, dequantize to f32: the f32 gradient reaching the u8 codes comes back as f16.
  Graph g;
  ValueId xi = g.input("x", {DType::f16, {3}});
  ValueId s = g.constant(f32({1}, {0.25}));
  ValueId z = g.constant(i32({1}, {0}));
  auto qm = g.apply("quantize", {xi, s, z});
  ValueId y = g.apply1("dequantize", {qm[0], s, z});
  ValueId dx = grad(g, g.apply1("sum", {y}), {xi})[0];
  EXPECT_EQ(g.value(dx).type, (TensorType{DType::f16, {3}}));
  Executor exec(g);
  auto got = exec.run({{"x", Tensor::from_doubles({3}, {1, -1, 100}, DType::f16)}}, {dx});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{1, 0, 0}));  // 400 > 255, -4 < 0
}

TEST(Dequantize, BackwardByHand) {
  // dq = dy * scale; dscale = sum(dy * (q - zp)) per channel (axis 0 of [2, 2]).
  Tensor q = Tensor::from_doubles({2, 2}, {1, 3, -2, 0}, DType::i8);
  auto g = run_op("dequantize_backward",
                  {f32({2, 2}, {1, 2, 3, 4}), q, f32({2}, {0.5, 2}), i32({2}, {1, 0})},
                  {{"scope", "channel"}, {"axis", 0}});
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{0.5, 1, 6, 8}));
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{1 * 0 + 2 * 2, 3 * -2 + 4 * 0}));
}

TEST(Quantize, EmptyTensorsFlowThrough) {
  Attrs a = {{"scope", "channel"}, {"axis", 1}};
  auto out = run_op("quantize", {f32({0, 3}, {}), f32({3}, {1, 1, 1}), i32({3}, {0, 0, 0})}, a);
  EXPECT_EQ(out[0].numel(), 0);
  EXPECT_EQ(out[1].numel(), 0);
  auto y = run_op("dequantize", {out[0], f32({3}, {1, 1, 1}), i32({3}, {0, 0, 0})}, a);
  EXPECT_EQ(y[0].shape(), (Shape{0, 3}));
  auto dx = run_op("quantize_backward", {f32({0, 3}, {}), out[1], f32({3}, {1, 1, 1})}, a);
  EXPECT_EQ(dx[0].numel(), 0);
}

TEST(Quantize, BadInput) {
  TensorType x{DType::f32, {2, 3}}, s1{DType::f32, {1}}, z1{DType::i32, {1}};
  TensorType s3{DType::f32, {3}}, z3{DType::i32, {3}};
  expect_error(
      [&] {
        build_op("quantize", {x, s3, z3}, {{"scope", "channel"}, {"axis", 2}});
      },
      {"[quantize]", "'axis' = 2", "out of range"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"scope", "group"}, {"group_size", 0}});
      },
      {"'group_size' = 0", "positive"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"bits", 9}});
      },
      {"'bits' = 9", "exceeds 8"});
  expect_error([&] { build_op("quantize", {x, s1, z1}, {{"bits", 1}}); }, {"'bits' = 1"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"quant_min", 100}, {"quant_max", 10}});
      },
      {"quant_min = 100", "quant_max = 10"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"signed", true}, {"out_dtype", "u8"}});
      },
      {"'out_dtype' = u8", "[-128, 127]", "holds [0, 255]"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"out_dtype", "i8"}});
      },
      {"[0, 255]", "'out_dtype' = i8"});
  expect_error(
      [&] {
        build_op("quantize", {x, s1, z1}, {{"quant_min", 0}, {"quant_max", 1000}});
      },
      {"[0, 1000]", "does not fit"});
  expect_error([&] { build_op("quantize", {x, s3, z1}); }, {"scale has shape [3]"});
  expect_error(
      [&] {
        build_op("quantize", {x, s3, z1}, {{"scope", "channel"}, {"axis", 1}});
      },
      {"zero_point has shape [1]", "[3]"});
  expect_error(
      [&] {
        build_op("quantize", {{DType::i8, {2, 3}}, s1, z1});
      },
      {"floating point", "i8[2, 3]"});
  expect_error([&] { build_op("quantize", {x, s1, s1}); }, {"zero_point must be i32 or i64"});
  // Zero point out of range: constants at graph-build time, fed values when run.
  Graph g;
  ValueId xi = g.input("x", x);
  expect_error(
      [&] {
        g.apply("quantize", {xi, g.constant(f32({1}, {1})), g.constant(i32({1}, {300}))});
      },
      {"zero_point[0] = 300", "[0, 255]"});
  expect_error(
      [&] {
        run_op("quantize", {f32({1}, {1}), f32({1}, {1}), i32({1}, {-1})});
      },
      {"zero_point[0] = -1"});
  expect_error(
      [&] {
        run_op("quantize", {f32({1}, {1}), f32({1}, {-2}), i32({1}, {0})});
      },
      {"scale[0] = -2"});
  // dequantize
  TensorType q{DType::i8, {2, 3}};
  expect_error(
      [&] {
        build_op("dequantize", {x, s1, z1});
      },
      {"[dequantize]", "q must be i8 or u8", "f32[2, 3]"});
  expect_error(
      [&] {
        build_op("dequantize", {q, s3, z3}, {{"scope", "channel"}, {"axis", -3}});
      },
      {"'axis' = -3"});
  expect_error(
      [&] {
        build_op("dequantize", {q, s1, z1}, {{"scope", "group"}, {"group_size", -2}});
      },
      {"'group_size' = -2"});
  expect_error([&] { build_op("dequantize", {q, s1, z3}); }, {"zero_point has shape [3]"});
  expect_error(
      [&] {
        run_op("dequantize",
               {Tensor::from_doubles({1}, {1}, DType::i8), f32({1}, {1}), i32({1}, {200})});
      },
      {"zero_point[0] = 200", "[-128, 127]"});
  // quantize_backward
  expect_error(
      [&] {
        build_op("quantize_backward", {x, {DType::u8, {2}}, s1});
      },
      {"[quantize_backward]", "mask has 2 bytes", "needs 1"});
}

}  // namespace
}  // namespace qg
