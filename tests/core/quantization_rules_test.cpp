// Hand-checked values and the error cases for the first quantization ops (per-tensor
// fake_quantize, min-max observer) and the shared range/qparams rules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/common/quant_attrs.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

struct FqOut {
  std::vector<double> y;
  std::vector<int> mask;
};

FqOut fake_quant(const std::vector<double>& x, double scale, int zp, const Attrs& attrs) {
  Graph g;
  ValueId in = g.input("x", {DType::f32, {static_cast<int64_t>(x.size())}});
  ValueId s = g.input("s", {DType::f32, {1}});
  ValueId z = g.input("z", {DType::i32, {1}});
  auto out = g.apply("fake_quantize", {in, s, z}, attrs);
  Executor exec(g);
  auto r = exec.run({{"x", Tensor::from_doubles({static_cast<int64_t>(x.size())}, x)},
                     {"s", Tensor::from_doubles({1}, {scale})},
                     {"z", Tensor::from_doubles({1}, {static_cast<double>(zp)}, DType::i32)}},
                    out);
  FqOut o{r[0].to_doubles(), {}};
  const uint8_t* m = r[1].data<uint8_t>();
  for (size_t i = 0; i < x.size(); ++i) o.mask.push_back((m[i / 8] >> (i % 8)) & 1);
  return o;
}

TEST(FakeQuantize, HandCheckedSignedPerTensor) {
  // scale 0.5, zp 0, signed 4-bit [-8, 7]:
  //  0.25 -> rint(0.5) = 0 (tie to even) -> 0;  0.75 -> rint(1.5) = 2 -> 1.0
  //  -3.9 -> rint(-7.8) = -8 -> -4.0;          3.9 -> rint(7.8) = 8 > 7 -> 3.5, out of range
  //  100 -> clamps to 3.5, out of range;       -0.0 stays (-0 * 0.5 = -0), in range
  FqOut o = fake_quant({0.25, 0.75, -3.9, 3.9, 100, -0.0}, 0.5, 0, {{"bits", 4}, {"signed", true}});
  EXPECT_EQ(o.y, (std::vector<double>{0.0, 1.0, -4.0, 3.5, 3.5, 0.0}));
  EXPECT_EQ(o.mask, (std::vector<int>{1, 1, 1, 0, 0, 1}));
}

TEST(FakeQuantize, HandCheckedUnsignedWithZeroPoint) {
  // u8 [0, 255], scale 0.1, zp 10: x = -1.0 -> rint(-10) + 10 = 0 -> (0 - 10) * 0.1 = -1.0
  //  x = -1.2 -> rint(-12) + 10 = -2 < 0 -> clamps to 0 -> -1.0, out of range.
  FqOut o = fake_quant({-1.0, -1.2, 0.0, 24.5}, 0.1f, 10, {});
  EXPECT_FLOAT_EQ(o.y[0], -1.0f);
  EXPECT_FLOAT_EQ(o.y[1], -1.0f);
  EXPECT_EQ(o.y[2], 0.0);
  EXPECT_FLOAT_EQ(o.y[3], 24.5f);
  EXPECT_EQ(o.mask, (std::vector<int>{1, 0, 1, 1}));
}

TEST(FakeQuantize, NonFiniteInputs) {
  const double inf = std::numeric_limits<double>::infinity();
  FqOut o = fake_quant({NAN, inf, -inf}, 0.5, 0, {{"bits", 4}, {"signed", true}});
  EXPECT_TRUE(std::isnan(o.y[0]));
  EXPECT_EQ(o.y[1], 3.5);
  EXPECT_EQ(o.y[2], -4.0);
  EXPECT_EQ(o.mask, (std::vector<int>{0, 0, 0}));
}

TEST(FakeQuantize, RuntimeScaleAndZeroPointChecks) {
  expect_error([] { fake_quant({1.0}, 0.0, 0, {}); },
               {"[fake_quantize]", "scale[0] = 0", "positive and finite"});
  expect_error([] { fake_quant({1.0}, -0.5, 0, {}); }, {"scale[0] = -0.5"});
  expect_error([] { fake_quant({1.0}, NAN, 0, {}); }, {"scale[0] = nan"});
  expect_error([] { fake_quant({1.0}, INFINITY, 0, {}); }, {"scale[0] = inf"});
  expect_error([] { fake_quant({1.0}, 0.1, 300, {}); },
               {"[fake_quantize]", "zero_point[0] = 300", "[0, 255]"});
  expect_error(
      [] {
        fake_quant({1.0}, 0.1, 8, {{"bits", 4}, {"signed", true}});
      },
      {"zero_point[0] = 8", "[-8, 7]"});
}

TEST(FakeQuantize, ConstantQparamsAreCheckedAtGraphBuildTime) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId bad_scale = g.constant(Tensor::from_doubles({1}, {-1.0}));
  ValueId zp = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
  expect_error([&] { g.apply("fake_quantize", {x, bad_scale, zp}); }, {"scale[0] = -1"});
  ValueId scale = g.constant(Tensor::from_doubles({1}, {0.1}));
  ValueId bad_zp = g.constant(Tensor::from_doubles({1}, {-3}, DType::i32));
  expect_error([&] { g.apply("fake_quantize", {x, scale, bad_zp}); }, {"zero_point[0] = -3"});
}

TEST(FakeQuantize, AttributeErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId s = g.input("s", {DType::f32, {1}});
  ValueId z = g.input("z", {DType::i32, {1}});
  expect_error(
      [&] {
        g.apply("fake_quantize", {x, s, z}, {{"bits", 1}});
      },
      {"[fake_quantize]", "'bits' = 1", "[2, 16]"});
  expect_error([&] { g.apply("fake_quantize", {x, s, z}, {{"bits", 17}}); }, {"'bits' = 17"});
  expect_error(
      [&] {
        g.apply("fake_quantize", {x, s, z}, {{"quant_min", 5}, {"quant_max", 5}});
      },
      {"quant_min = 5 must be below quant_max = 5"});
  expect_error(
      [&] {
        g.apply("fake_quantize", {x, s, z}, {{"quant_min", 9}, {"quant_max", 2}});
      },
      {"quant_min = 9"});
  expect_error(
      [&] {
        g.apply("fake_quantize", {x, s, z}, {{"quant_min", 0}});
      },
      {"given together"});
  expect_error(
      [&] {
        g.apply("fake_quantize", {x, s, z}, {{"scope", "channel"}, {"axis", 1}});
      },
      {"'axis' = 1", "rank 1"});
  ValueId s2 = g.input("s2", {DType::f32, {2}});
  expect_error([&] { g.apply("fake_quantize", {x, s2, z}); }, {"scale has shape [2]"});
  ValueId xi = g.input("xi", {DType::i8, {4}});
  expect_error([&] { g.apply("fake_quantize", {xi, s, z}); }, {"floating point", "i8[4]"});
}

TEST(QuantRange, BitsSignednessNarrowAndReduce) {
  const OpDef& op = OpRegistry::instance().get("minmax_observer");
  auto range = [&](const Attrs& a) { return quant_range_from_attrs("t", resolve_attrs(op, a)); };
  EXPECT_EQ(range({}).qmin, 0);
  EXPECT_EQ(range({}).qmax, 255);
  EXPECT_EQ(range({{"signed", true}}).qmin, -128);
  EXPECT_EQ(range({{"signed", true}, {"narrow_range", true}}).qmin, -127);
  EXPECT_EQ(range({{"bits", 4}, {"signed", true}}).qmax, 7);
  EXPECT_EQ(range({{"reduce_range", true}}).qmax, 127);
  EXPECT_EQ(range({{"signed", true}, {"reduce_range", true}}).qmin, -64);
  EXPECT_EQ(range({{"signed", true}, {"reduce_range", true}}).qmax, 63);
  EXPECT_EQ(range({{"quant_min", -7}, {"quant_max", 9}, {"reduce_range", true}}).qmin, -4);
  EXPECT_EQ(range({{"bits", 16}}).qmax, 65535);
}

TEST(MinMaxObserver, HandCheckedAffineAndSymmetricQparams) {
  // min -1, max 3, u8 affine: scale = 4 / 255, zp = 0 - rint(-1 / scale) = rint(63.75) = 64.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  auto aff = g.apply("minmax_observer", {x});
  auto sym = g.apply("minmax_observer", {x}, {{"qscheme", "symmetric"}, {"signed", true}});
  auto symq =
      g.apply("minmax_observer", {x},
              {{"qscheme", "symmetric"}, {"signed", true}, {"symmetric_denominator", "qmax"}});
  auto symu = g.apply("minmax_observer", {x}, {{"qscheme", "symmetric"}});
  Executor exec(g);
  auto r = exec.run({{"x", Tensor::from_doubles({2}, {-1, 3})}},
                    {aff[0], aff[1], sym[0], sym[1], symq[0], symu[1]});
  EXPECT_EQ(r[0].at(0), static_cast<double>(4.0f / 255.0f));
  EXPECT_EQ(r[1].at(0), 64);
  EXPECT_EQ(r[2].at(0), static_cast<double>(3.0f / 127.5f));  // amax / ((127 - -128) / 2)
  EXPECT_EQ(r[3].at(0), 0);
  EXPECT_EQ(r[4].at(0), static_cast<double>(3.0f / 127.0f));
  EXPECT_EQ(r[5].at(0), 128);  // PyTorch: default unsigned 8-bit symmetric zp
}

TEST(MinMaxObserver, UninitialisedAndNonFinite) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3}});
  auto qp = g.apply("minmax_observer", {x});
  Executor exec(g);
  auto r = exec.run({{"x", Tensor::from_doubles({3}, {NAN, INFINITY, -INFINITY})}}, {qp[0], qp[1]});
  EXPECT_EQ(r[0].at(0), 1.0);
  EXPECT_EQ(r[1].at(0), 0);
  EXPECT_EQ(exec.state(g.value(qp[0]).producer, "nonfinite_count").at(0), 3);
}

TEST(MinMaxObserver, EpsIsValidated) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3}});
  expect_error([&] { g.apply("minmax_observer", {x}, {{"eps", -1.0}}); }, {"'eps' = -1"});
}

}  // namespace
}  // namespace qg
