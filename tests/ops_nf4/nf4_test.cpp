// NF4 quantize + pack / unpack + dequantize and the double quantization of absmax values:
// hand-checked codes, midpoint ties, special values, zero groups and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/graph.h"
#include "ops/nf4/nf4_math.h"
#include "runtime/executor.h"

namespace qg {
namespace {

std::vector<Tensor> run_op(const std::string& op, const std::vector<Tensor>& inputs,
                           const Attrs& attrs) {
  Graph g;
  std::vector<ValueId> in;
  Executor::Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    in.push_back(g.input(name, {inputs[i].dtype(), inputs[i].shape()}));
    feeds[name] = inputs[i];
  }
  auto out = g.apply(op, in, attrs);
  Executor exec(g);
  return exec.run(feeds, out);
}

// Unpacks low-first nibbles into codes.
std::vector<int> codes_of(const Tensor& packed, int64_t n) {
  std::vector<int> c;
  for (int64_t k = 0; k < n; ++k) {
    int byte = static_cast<int>(packed.at(k / 2));
    c.push_back(k % 2 ? byte >> 4 : byte & 0xF);
  }
  return c;
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

TEST(Nf4, HandCheckedCodes) {
  // absmax 1: 1 -> 15, -1 -> 0, 0 -> 7; 0.5 lies between midpoints 0.389 and 0.502 -> 12;
  // -0.3 between -0.340 and -0.235 -> 4; -0.0 -> 7.
  Tensor x = Tensor::from_doubles({6}, {1.0, -1.0, 0.0, 0.5, -0.3, -0.0});
  auto out = run_op("nf4_quantize_pack", {x}, {});
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1.0}));
  EXPECT_EQ(codes_of(out[0], 6), (std::vector<int>{15, 0, 7, 12, 4, 7}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{15 | 0 << 4, 7 | 12 << 4, 4 | 7 << 4}));
  auto y = run_op("nf4_unpack_dequantize", {out[0], out[1]}, {{"shape", {6}}})[0];
  EXPECT_EQ(y.to_doubles(),
            (std::vector<double>{1.0, -1.0, 0.0, static_cast<double>(0.44070982933044434f),
                                 static_cast<double>(-0.28444138169288635f), 0.0}));
}

TEST(Nf4, MidpointTiesTakeTheLowerCode) {
  const float mid = nf4::midpoint<float>(7);  // between 0.0 and 0.0796
  const float above = std::nextafter(mid, 1.0f);
  Tensor x = Tensor::from_doubles({3}, {1.0, mid, above});
  auto out = run_op("nf4_quantize_pack", {x}, {});
  EXPECT_EQ(codes_of(out[0], 3), (std::vector<int>{15, 7, 8}));
}

TEST(Nf4, SpecialValuesAndScaling) {
  // absmax over finite values only: 4. NaN -> 7, +Inf -> 15, -Inf -> 0; -4 -> 0, 2 -> v 0.5 -> 12.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_doubles({5}, {std::nan(""), inf, -inf, -4.0, 2.0});
  auto out = run_op("nf4_quantize_pack", {x}, {{"group_size", 8}});
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{4.0}));
  EXPECT_EQ(codes_of(out[0], 5), (std::vector<int>{7, 15, 0, 0, 12}));
  // Odd count: the last byte's high nibble is padding 0.
  EXPECT_EQ(static_cast<int>(out[0].at(2)) >> 4, 0);
}

TEST(Nf4, ZeroGroupStoresAbsmaxZeroAndDequantizesToZeros) {
  Tensor x = Tensor::from_doubles({2, 3}, {0.0, -0.0, 0.0, 0.25, -0.5, 1.0});
  auto out = run_op("nf4_quantize_pack", {x}, {{"group_size", 3}});
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(codes_of(out[0], 3), (std::vector<int>{7, 7, 7}));
  auto y =
      run_op("nf4_unpack_dequantize", {out[0], out[1]}, {{"group_size", 3}, {"shape", {2, 3}}});
  auto v = y[0].to_doubles();
  EXPECT_EQ(std::vector<double>(v.begin(), v.begin() + 3), (std::vector<double>{0, 0, 0}));
}

TEST(Nf4, AxisTailGroupsAndHighFirst) {
  // Shape [3, 1], groups of 2 along axis 0: {2, -1} and the tail {0.5}.
  Tensor x = Tensor::from_doubles({3, 1}, {2.0, -1.0, 0.5});
  auto out = run_op("nf4_quantize_pack", {x}, {{"axis", 0}, {"group_size", 2}});
  ASSERT_EQ(out[1].shape(), Shape({2, 1}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{2.0, 0.5}));
  // v = 1 -> 15, -0.5 -> 2 (between -0.610 and -0.460), 1 -> 15.
  EXPECT_EQ(codes_of(out[0], 3), (std::vector<int>{15, 2, 15}));
  auto hf = run_op("nf4_quantize_pack", {x},
                   {{"axis", 0}, {"group_size", 2}, {"nibble_order", "high_first"}});
  EXPECT_EQ(hf[0].to_doubles(), (std::vector<double>{15 << 4 | 2, 15 << 4}));
  auto y = run_op("nf4_unpack_dequantize", {hf[0], hf[1]},
                  {{"axis", 0},
                   {"group_size", 2},
                   {"shape", {3, 1}},
                   {"nibble_order", "high_first"},
                   {"dtype", "f64"}})[0];
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_EQ(y.to_doubles(),
            (std::vector<double>{2.0, 2.0 * static_cast<double>(-0.5250730514526367f), 0.5}));
}

TEST(Nf4, HalfAndDoubleInputs) {
  std::vector<double> v = {0.125, -0.75, 0.5, 1.0};
  auto f = run_op("nf4_quantize_pack", {Tensor::from_doubles({4}, v)}, {});
  auto h = run_op("nf4_quantize_pack", {Tensor::from_doubles({4}, v, DType::f16)}, {});
  auto d = run_op("nf4_quantize_pack", {Tensor::from_doubles({4}, v, DType::f64)}, {});
  EXPECT_EQ(h[1].dtype(), DType::f32);
  EXPECT_EQ(d[1].dtype(), DType::f64);
  EXPECT_EQ(h[0].to_doubles(), f[0].to_doubles());
  EXPECT_EQ(d[0].to_doubles(), f[0].to_doubles());
}

TEST(Nf4, DoubleQuantizationRoundTrip) {
  // Blocks of 2: {0.5, 1.0} -> min 0.5, scale 0.5 / 255, codes 0, 255; {2.0} alone has
  // range 0 -> scale 1, code 0, and decodes to its min exactly.
  Tensor a = Tensor::from_doubles({3}, {0.5, 1.0, 2.0});
  auto dq = run_op("nf4_double_quantize", {a}, {{"block_size", 2}});
  EXPECT_EQ(dq[0].to_doubles(), (std::vector<double>{0, 255, 0}));
  EXPECT_EQ(dq[1].to_doubles(), (std::vector<double>{0.5f / 255.0f, 1.0}));
  EXPECT_EQ(dq[2].to_doubles(), (std::vector<double>{0.5, 2.0}));
  auto back = run_op("nf4_double_dequantize", {dq[0], dq[1], dq[2]}, {{"block_size", 2}})[0];
  EXPECT_EQ(back.to_doubles()[0], 0.5);
  EXPECT_NEAR(back.to_doubles()[1], 1.0, 1e-7);
  EXPECT_EQ(back.to_doubles()[2], 2.0);
  // Error bound: half a step of each block, plus a few f32 roundings at magnitude ~3
  // ((a - min) * inv, code * scale + min) that can move a value across a rounding boundary.
  std::vector<double> many;
  for (int i = 0; i < 600; ++i) many.push_back(0.01 + std::fabs(std::sin(i * 0.37)) * 3.0);
  Tensor m = Tensor::from_doubles({20, 30}, many);
  dq = run_op("nf4_double_quantize", {m}, {});
  ASSERT_EQ(dq[1].shape(), Shape({3}));
  back = run_op("nf4_double_dequantize", {dq[0], dq[1], dq[2]}, {})[0];
  ASSERT_EQ(back.shape(), Shape({20, 30}));
  for (int i = 0; i < 600; ++i) {
    EXPECT_LE(std::fabs(back.at(i) - m.at(i)), dq[1].at(i / 256) * 0.5 + 1e-6) << i;
  }
}

TEST(Nf4, RejectsBadInput) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 6}});
  ValueId xi = g.input("xi", {DType::i8, {4}});
  expect_error(
      [&] {
        g.apply("nf4_quantize_pack", {x}, {{"group_size", -3}});
      },
      {"nf4_quantize_pack", "group_size", "-3", "must be positive"});
  expect_error(
      [&] {
        g.apply("nf4_quantize_pack", {x}, {{"axis", -3}});
      },
      {"nf4_quantize_pack", "axis", "-3"});
  expect_error([&] { g.apply("nf4_quantize_pack", {xi}); }, {"nf4_quantize_pack", "i8"});
  ValueId p12 = g.input("p12", {DType::u8, {12}});
  ValueId p13 = g.input("p13", {DType::u8, {13}});
  ValueId a = g.input("a", {DType::f32, {4, 1}});
  ValueId a_bad = g.input("a_bad", {DType::f32, {4}});
  ValueId a_int = g.input("a_int", {DType::i32, {4, 1}});
  Attrs at = {{"group_size", 6}, {"shape", {4, 6}}};
  EXPECT_NO_THROW(g.apply("nf4_unpack_dequantize", {p12, a}, at));
  expect_error(
      [&] {
        g.apply("nf4_unpack_dequantize", {p13, a}, at);
      },
      {"nf4_unpack_dequantize", "packed buffer has 13 bytes", "needs 12 bytes"});
  expect_error(
      [&] {
        g.apply("nf4_unpack_dequantize", {p12, a_bad}, at);
      },
      {"nf4_unpack_dequantize", "absmax has shape [4]", "needs [4, 1]"});
  expect_error(
      [&] {
        g.apply("nf4_unpack_dequantize", {p12, a_int}, at);
      },
      {"nf4_unpack_dequantize", "absmax must be f32 or f64"});
  expect_error(
      [&] {
        g.apply("nf4_double_quantize", {a}, {{"block_size", 0}});
      },
      {"nf4_double_quantize", "block_size", "must be positive"});
  ValueId code = g.input("code", {DType::u8, {300}});
  ValueId s1 = g.input("s1", {DType::f32, {1}});
  ValueId s2 = g.input("s2", {DType::f32, {2}});
  ValueId s2d = g.input("s2d", {DType::f64, {2}});
  EXPECT_NO_THROW(g.apply("nf4_double_dequantize", {code, s2, s2}));
  expect_error(
      [&] {
        g.apply("nf4_double_dequantize", {code, s1, s1});
      },
      {"nf4_double_dequantize", "must be [2]", "300 codes"});
  expect_error(
      [&] {
        g.apply("nf4_double_dequantize", {code, s2, s2d});
      },
      {"nf4_double_dequantize", "block_min"});
}

TEST(Nf4, RejectsBadAbsmaxValuesAtRunTime) {
  Tensor packed = Tensor::from_doubles({1}, {0x77}, DType::u8);
  expect_error(
      [&] {
        run_op("nf4_unpack_dequantize", {packed, Tensor::from_doubles({1}, {-1.0})},
               {{"shape", {2}}});
      },
      {"nf4_unpack_dequantize", "absmax[0] = -1", "finite and >= 0"});
  expect_error(
      [&] {
        run_op("nf4_double_quantize", {Tensor::from_doubles({2}, {1.0, std::nan("")})}, {});
      },
      {"nf4_double_quantize", "absmax[1]", "finite and >= 0"});
}

}  // namespace
}  // namespace qg
