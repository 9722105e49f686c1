// INT4 group quantize + pack / unpack + dequantize: hand-checked codes and bytes, layouts,
// tail groups, special values, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/graph.h"
#include "runtime/executor.h"

namespace qg {
namespace {

struct Packed {
  std::vector<double> bytes, scale, zp;
  Tensor packed, scale_t, zp_t;
};

Packed quantize(const Tensor& x, const Attrs& attrs) {
  Graph g;
  ValueId in = g.input("x", {x.dtype(), x.shape()});
  auto out = g.apply("int4_quantize_pack", {in}, attrs);
  Executor exec(g);
  auto got = exec.run({{"x", x}}, out);
  return {got[0].to_doubles(), got[1].to_doubles(), got[2].to_doubles(), got[0], got[1], got[2]};
}

Tensor dequantize(const Tensor& packed, const Tensor& scale, const Tensor& zp, const Attrs& attrs) {
  Graph g;
  ValueId p = g.input("p", {packed.dtype(), packed.shape()});
  ValueId s = g.input("s", {scale.dtype(), scale.shape()});
  ValueId z = g.input("z", {zp.dtype(), zp.shape()});
  ValueId y = g.apply1("int4_unpack_dequantize", {p, s, z}, attrs);
  Executor exec(g);
  return exec.run({{"p", packed}, {"s", scale}, {"z", zp}}, {y})[0];
}

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected qg::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
}

TEST(Int4, SymmetricCodesAndLowFirstBytes) {
  // Groups of 3 along the only axis: [0.5, 1.5, -2.5] and the tail group [7, 0.1].
  Tensor x = Tensor::from_doubles({5}, {0.5, 1.5, -2.5, 7.0, 0.1});
  Packed p = quantize(x, {{"group_size", 3}});
  const float s0 = 2.5f / 7.0f;
  ASSERT_EQ(p.scale.size(), 2u);
  EXPECT_EQ(p.scale[0], s0);
  EXPECT_EQ(p.scale[1], 1.0);  // 7 / 7
  EXPECT_EQ(p.zp, (std::vector<double>{8, 8}));
  // x * (1 / s0) = 1.4, 4.2, -7 -> codes 9, 12, 1; tail: 7 -> 15, 0.1 -> 8.
  // Bytes: (9 | 12 << 4), (1 | 15 << 4), (8 | pad 0 << 4).
  EXPECT_EQ(p.bytes, (std::vector<double>{0xC9, 0xF1, 0x08}));
  Packed h = quantize(x, {{"group_size", 3}, {"nibble_order", "high_first"}});
  EXPECT_EQ(h.bytes, (std::vector<double>{0x9C, 0x1F, 0x80}));
  Tensor y = dequantize(p.packed, p.scale_t, p.zp_t, {{"group_size", 3}, {"shape", {5}}});
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{1 * s0, 4 * s0, -7 * s0, 7.0, 0.0}));
  Tensor yh = dequantize(h.packed, h.scale_t, h.zp_t,
                         {{"group_size", 3}, {"shape", {5}}, {"nibble_order", "high_first"}});
  EXPECT_EQ(yh.to_doubles(), y.to_doubles());
}

TEST(Int4, TiesRoundToEvenAndClampToMinusEight) {
  // absmax 7 -> scale 1: 3.5 -> 4, 2.5 -> 2, -0.5 -> -0, -7 -> -7.
  Packed p = quantize(Tensor::from_doubles({4}, {3.5, 2.5, -0.5, -7.0}), {{"group_size", 4}});
  EXPECT_EQ(p.bytes, (std::vector<double>{12 | 10 << 4, 8 | 1 << 4}));
  // NaN -> code 8 (the zero point), +Inf -> 15, -Inf -> 0 (clamped to -8); range 1 -> 1/7.
  const double inf = std::numeric_limits<double>::infinity();
  Packed s = quantize(Tensor::from_doubles({4}, {std::nan(""), inf, -inf, 1.0}), {});
  EXPECT_EQ(s.scale[0], 1.0f / 7.0f);
  EXPECT_EQ(s.bytes, (std::vector<double>{8 | 15 << 4, 0 | 15 << 4}));
}

TEST(Int4, AsymmetricCodesAndZeroPoint) {
  // Range [-1, 4]: scale = 5 / 15, inv = 3, zp = rint(1 * 3) = 3; codes 0, 3, 9, 15.
  Tensor x = Tensor::from_doubles({4}, {-1.0, 0.0, 2.0, 4.0});
  Packed p = quantize(x, {{"mode", "asymmetric"}});
  const float scale = 5.0f / 15.0f;
  EXPECT_EQ(p.scale[0], scale);
  EXPECT_EQ(p.zp, (std::vector<double>{3}));
  EXPECT_EQ(p.bytes, (std::vector<double>{0 | 3 << 4, 9 | 15 << 4}));
  Tensor y = dequantize(p.packed, p.scale_t, p.zp_t, {{"shape", {4}}});
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{-3 * scale, 0.0, 6 * scale, 12 * scale}));
  // All-positive group: the range is extended to 0, so zp = 0.
  Packed q = quantize(Tensor::from_doubles({2}, {3.0, 1.5}), {{"mode", "asymmetric"}});
  EXPECT_EQ(q.scale[0], 3.0f / 15.0f);
  EXPECT_EQ(q.zp, (std::vector<double>{0}));
}

TEST(Int4, AllZeroGroupsGetScaleOne) {
  for (const char* mode : {"symmetric", "asymmetric"}) {
    Packed p = quantize(Tensor::from_doubles({2, 2}, {0, 0, 0.0, -0.0}), {{"mode", mode}});
    EXPECT_EQ(p.scale, (std::vector<double>{1, 1})) << mode;
    const double zp = std::string(mode) == "symmetric" ? 8 : 0;
    EXPECT_EQ(p.zp, (std::vector<double>{zp, zp})) << mode;
    Tensor y = dequantize(p.packed, p.scale_t, p.zp_t, {{"shape", {2, 2}}});
    EXPECT_EQ(y.to_doubles(), (std::vector<double>{0, 0, 0, 0})) << mode;
  }
}

TEST(Int4, GroupsAlongAnotherAxisWithTail) {
  // Shape [3, 2], groups of 2 along axis 0: column groups {rows 0-1} and the tail {row 2}.
  Tensor x = Tensor::from_doubles({3, 2}, {7, -14, 1, 2, -3.5, 0});
  Packed p = quantize(x, {{"axis", 0}, {"group_size", 2}});
  ASSERT_EQ(p.scale_t.shape(), Shape({2, 2}));
  EXPECT_EQ(p.scale, (std::vector<double>{1.0, 2.0, 0.5, 1.0}));
  // Codes (flat C order): 7/1->15, -14/2->1, 1/1->9, 2/2->9, -3.5/0.5->1, 0 (scale 1)->8.
  EXPECT_EQ(p.bytes, (std::vector<double>{15 | 1 << 4, 9 | 9 << 4, 1 | 8 << 4}));
  Tensor y =
      dequantize(p.packed, p.scale_t, p.zp_t, {{"axis", 0}, {"group_size", 2}, {"shape", {3, 2}}});
  EXPECT_EQ(y.to_doubles(), x.to_doubles());
}

TEST(Int4, HalfAndDoubleInputs) {
  std::vector<double> v = {0.25, -1.75, 3.0, 0.5, -0.125};
  Packed f = quantize(Tensor::from_doubles({5}, v), {{"group_size", 2}});
  Packed h = quantize(Tensor::from_doubles({5}, v, DType::f16), {{"group_size", 2}});
  Packed b = quantize(Tensor::from_doubles({5}, v, DType::bf16), {{"group_size", 2}});
  Packed d = quantize(Tensor::from_doubles({5}, v, DType::f64), {{"group_size", 2}});
  EXPECT_EQ(h.scale_t.dtype(), DType::f32);
  EXPECT_EQ(d.scale_t.dtype(), DType::f64);
  EXPECT_EQ(h.bytes, f.bytes);  // exactly representable values: same codes in every type
  EXPECT_EQ(b.bytes, f.bytes);
  EXPECT_EQ(d.bytes, f.bytes);
  EXPECT_EQ(d.scale[0], 1.75 / 7.0);  // computed in f64
  Tensor y = dequantize(d.packed, d.scale_t, d.zp_t,
                        {{"group_size", 2}, {"shape", {5}}, {"dtype", "f16"}});
  EXPECT_EQ(y.dtype(), DType::f16);
}

TEST(Int4, F64ScaleToHalfOutputRoundsOnce) {
  // 1 + 2^-11 + 2^-30 lies just above the f16 midpoint 1 + 2^-11: one rounding gives
  // 1 + 2^-10, but rounding through f32 first lands on the midpoint and then on 1.0.
  const double s = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  Tensor packed = Tensor::from_doubles({1}, {0x99}, DType::u8);  // codes 9, 9
  Tensor y =
      dequantize(packed, Tensor::from_doubles({1}, {s}, DType::f64),
                 Tensor::from_doubles({1}, {8}, DType::u8), {{"shape", {2}}, {"dtype", "f16"}});
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{1.0009765625, 1.0009765625}));
}

TEST(Int4, RoundTripErrorIsAtMostHalfAStep) {
  std::vector<double> v;
  for (int i = 0; i < 37; ++i) v.push_back(std::sin(i * 1.3) * (1 + i % 5));
  for (const char* mode : {"symmetric", "asymmetric"}) {
    Packed p = quantize(Tensor::from_doubles({37}, v), {{"group_size", 8}, {"mode", mode}});
    std::vector<double> y =
        dequantize(p.packed, p.scale_t, p.zp_t, {{"group_size", 8}, {"shape", {37}}}).to_doubles();
    for (int i = 0; i < 37; ++i) {
      EXPECT_LE(std::fabs(y[i] - v[i]), p.scale[i / 8] * 0.5 * (1 + 1e-6)) << mode << " " << i;
    }
  }
}

TEST(Int4, EmptyTensor) {
  Packed p = quantize(Tensor::from_doubles({2, 0}, {}), {{"group_size", 4}});
  EXPECT_TRUE(p.bytes.empty());
  EXPECT_EQ(p.scale_t.shape(), Shape({2, 0}));
}

TEST(Int4, RejectsBadInput) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 6}});
  ValueId xi = g.input("xi", {DType::i32, {4}});
  ValueId x0 = g.input("x0", {DType::f32, {}});
  expect_error(
      [&] {
        g.apply("int4_quantize_pack", {x}, {{"group_size", 0}});
      },
      {"int4_quantize_pack", "group_size", "= 0", "must be positive"});
  expect_error(
      [&] {
        g.apply("int4_quantize_pack", {x}, {{"axis", 2}});
      },
      {"int4_quantize_pack", "axis", "2"});
  expect_error(
      [&] {
        g.apply("int4_quantize_pack", {x}, {{"mode", "linear"}});
      },
      {"int4_quantize_pack", "mode", "linear"});
  expect_error([&] { g.apply("int4_quantize_pack", {xi}); }, {"int4_quantize_pack", "i32"});
  expect_error([&] { g.apply("int4_quantize_pack", {x0}); }, {"int4_quantize_pack", "rank"});
  expect_error(
      [&] {
        g.apply("int4_quantize_pack", {x}, {{"nibble_order", "msb"}});
      },
      {"nibble_order", "msb"});

  ValueId p12 = g.input("p12", {DType::u8, {12}});
  ValueId p11 = g.input("p11", {DType::u8, {11}});
  ValueId pi8 = g.input("pi8", {DType::i8, {12}});
  ValueId s = g.input("s", {DType::f32, {4, 2}});
  ValueId s_bad = g.input("s_bad", {DType::f32, {4, 3}});
  ValueId z = g.input("z", {DType::u8, {4, 2}});
  ValueId zf = g.input("zf", {DType::f32, {4, 2}});
  Attrs a = {{"group_size", 3}, {"shape", {4, 6}}};
  EXPECT_NO_THROW(g.apply("int4_unpack_dequantize", {p12, s, z}, a));
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {p11, s, z}, a);
      },
      {"int4_unpack_dequantize", "packed buffer has 11 bytes", "needs 12 bytes"});
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {pi8, s, z}, a);
      },
      {"int4_unpack_dequantize", "1-D u8"});
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {p12, s_bad, z}, a);
      },
      {"int4_unpack_dequantize", "scale has shape [4, 3]", "needs [4, 2]"});
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {p12, s, zf}, a);
      },
      {"int4_unpack_dequantize", "zero_point must be u8 or i32"});
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {p12, s, z}, {{"group_size", 3}});
      },
      {"int4_unpack_dequantize", "shape", "missing"});
  expect_error(
      [&] {
        g.apply("int4_unpack_dequantize", {p12, s, z}, {{"group_size", 3}, {"shape", {4, -6}}});
      },
      {"int4_unpack_dequantize", "negative"});
}

TEST(Int4, RejectsBadQparamValuesAtRunTime) {
  Tensor packed = Tensor::from_doubles({1}, {0x88}, DType::u8);
  Attrs a = {{"shape", {2}}};
  expect_error(
      [&] {
        dequantize(packed, Tensor::from_doubles({1}, {1.0}),
                   Tensor::from_doubles({1}, {16}, DType::u8), a);
      },
      {"int4_unpack_dequantize", "zero_point[0] = 16", "[0, 15]"});
  expect_error(
      [&] {
        dequantize(packed, Tensor::from_doubles({1}, {-1.0}),
                   Tensor::from_doubles({1}, {8}, DType::u8), a);
      },
      {"int4_unpack_dequantize", "scale[0] = -1"});
}

}  // namespace
}  // namespace qg
