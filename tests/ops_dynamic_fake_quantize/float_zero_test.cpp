// dynamic_fake_quantize's float_zero mode (torchao's int4 weight-only QAT, tinygemm's float
// zero point): hand-checked qparams and values in f32 and bf16, the rounding of scale and zero
// to bf16 (qparam_dtype) and the clamped codes it can leave, the eps floor of a constant
// group, the STE gradient, its bad inputs, and the GPU against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

Attrs float_zero(int64_t group, const std::string& qparam_dtype = "input") {
  return {{"quant_min", 0},      {"quant_max", 15},
          {"group_size", group}, {"mode", std::string("float_zero")},
          {"eps", 1e-6},         {"qparam_dtype", qparam_dtype}};
}

std::vector<bool> mask_bits(const Tensor& mask, int64_t n) {
  std::vector<bool> b;
  for (int64_t i = 0; i < n; ++i) b.push_back((mask.data<uint8_t>()[i / 8] >> (i % 8)) & 1);
  return b;
}

// Group [-1.5, 0, 6, 1.2]: range 7.5, scale 7.5 x f32(1/15) = 0.5 exactly; zero = -1.5 + 8 x
// 0.5 = 2.5, so code 0 stands for -1.5. 1.2 -> (1.2 + 1.5) / 0.5 = 5.4 -> 5 -> (5 - 8) x 0.5 +
// 2.5 = 1.0. Every value is a bf16 value, so bf16 gives the same.
TEST(DynamicFakeQuantizeFloatZero, QparamsAndValuesByHand) {
  for (DType d : {DType::f32, DType::bf16, DType::f64}) {
    Tensor x = Tensor::from_doubles({1, 4}, {-1.5, 0.0, 6.0, 1.2}, d);
    auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(4));
    EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.5})) << dtype_name(d);
    ASSERT_EQ(out[3].dtype(), DType::f32);  // the zero is a float
    EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{2.5}));
    EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-1.5, 0.0, 6.0, 1.0}));
    EXPECT_EQ(mask_bits(out[1], 4), std::vector<bool>(4, true));
  }
}

// The range is the group's own (0 is not added): a constant group has range 0 and takes the
// scale eps = 1e-6; its zero is min + 8 x eps, so code 0 stands for min again (0.3 - low
// rounds to 0 in f32) and the group comes back as itself.
TEST(DynamicFakeQuantizeFloatZero, ConstantGroupTakesEps) {
  Tensor x = Tensor::from_doubles({1, 4}, {0.3, 0.3, 0.3, 0.3}, DType::f32);
  auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(4));
  const float eps = 1e-6f, zero = 0.3f + 8.0f * eps;
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{eps}));
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{zero}));
  EXPECT_EQ(out[0].to_doubles(), std::vector<double>(4, 0.3f));
  EXPECT_EQ(mask_bits(out[1], 4), std::vector<bool>(4, true));
}

// f32 weights with bf16 qparams (torchao's int4 weight-only QAT with f32 weights): group
// [0, 1, 0.5, 0.25] has the f32 scale f32(1/15) = 0.0666667, rounded up to the bf16 137/128 x
// 2^-4 = 0.06689453125, and the zero 8 x 0.0666667 = 0.5333 rounded to 137/128 x 2^-1 =
// 0.53515625 (from the f32 scale), so code 0 stands for 0. 1 / 0.0669 = 14.95 -> 15 -> 7 x
// 0.06689453125 + 0.53515625 = 1.00341796875; 0.5 -> 7.47 -> 7; 0.25 -> 3.74 -> 4.
TEST(DynamicFakeQuantizeFloatZero, Bf16QparamsOfF32Weights) {
  Tensor x = Tensor::from_doubles({1, 4}, {0.0, 1.0, 0.5, 0.25}, DType::f32);
  auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(4, "bf16"));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.06689453125}));
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{0.53515625}));
  EXPECT_EQ(out[0].to_doubles(),
            (std::vector<double>{0.0, 1.00341796875, 0.46826171875, 0.267578125}));
  // Without the bf16 rounding the same group keeps f32 qparams.
  auto f32 = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(4));
  EXPECT_EQ(static_cast<float>(f32[2].to_doubles()[0]), 1.0f * (1.0f / 15.0f));
}

// A bf16 zero far from 0 loses the group: [100.25, 100.5, 100.375, 100.25] has the f32 zero
// 100.38, which bf16 (steps of 0.5 there) rounds to 100.5; low = 100.5 - 0.134 rounds to
// 100.5 too. So 100.25 and 100.375 fall below code 0 (clamped, mask 0) and every element
// dequantizes to 100.5 - 8 x 0.0167236328125 = 100.3662109375.
TEST(DynamicFakeQuantizeFloatZero, Bf16ZeroClampsCodesAndClearsTheMask) {
  Tensor x = Tensor::from_doubles({1, 4}, {100.25, 100.5, 100.375, 100.25}, DType::f32);
  auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(4, "bf16"));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.0167236328125}));
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{100.5}));
  EXPECT_EQ(out[0].to_doubles(), std::vector<double>(4, 100.3662109375));
  EXPECT_EQ(mask_bits(out[1], 4), (std::vector<bool>{false, true, false, false}));
  // The STE passes dy where the code was in range only.
  Graph g;
  ValueId v = g.input("x", {DType::f32, {1, 4}});
  ValueId loss = g.apply1("sum", {g.apply("dynamic_fake_quantize", {v}, float_zero(4, "bf16"))[0]});
  ValueId dx = grad(g, loss, {v})[0];
  Executor ex(g);
  EXPECT_EQ(ex.run({{"x", x}}, {dx})[0].to_doubles(), (std::vector<double>{0, 1, 0, 0}));
}

TEST(DynamicFakeQuantizeFloatZero, BadInputsAreNamedErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3, 16}});
  Attrs signed_range = float_zero(8);
  signed_range.set("quant_min", -8);
  signed_range.set("quant_max", 7);
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, signed_range); },
               {"[dynamic_fake_quantize]", "float_zero", "unsigned", "[-8, 7]"});
  Attrs qdt = float_zero(8, "bf16");
  qdt.set("mode", std::string("symmetric"));
  qdt.set("quant_min", -8);
  qdt.set("quant_max", 7);
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, qdt); },
               {"[dynamic_fake_quantize]", "'qparam_dtype' = bf16", "float_zero only"});
  Attrs unknown = float_zero(8, "i8");
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, unknown); },
               {"dynamic_fake_quantize", "qparam_dtype", "i8"});
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, float_zero(6)); },
               {"[dynamic_fake_quantize]", "'group_size' = 6", "does not divide", "[3, 16]"});
}

// GPU against CPU, bit for bit, every output: the recipe's groups (team kernel), odd groups
// (byte kernel), in every float dtype, with input-dtype and bf16 qparams.
TEST(DynamicFakeQuantizeFloatZero, GpuMatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape shape;
    int64_t group;
  };
  const std::vector<Case> cases = {{{96, 1024}, 32},  {{48, 512}, 64}, {{9, 768}, 128},
                                   {{11, 1024}, 256}, {{5, 12}, 3},    {{7, 40}, 40}};
  uint32_t seed = 7;
  for (const Case& c : cases)
    for (const std::string qdt : {"input", "bf16"})
      for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        Tensor x = testing::random_f32(c.shape, seed++).cast(d);
        auto cpu = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, float_zero(c.group, qdt));
        auto gpu = run_op(Device::cuda(), "dynamic_fake_quantize", {x}, float_zero(c.group, qdt));
        for (size_t k = 0; k < cpu.size(); ++k) {
          ASSERT_EQ(cpu[k].nbytes(), gpu[k].nbytes());
          EXPECT_EQ(std::memcmp(cpu[k].raw_data(), gpu[k].raw_data(), cpu[k].nbytes()), 0)
              << "output " << k << " " << dtype_name(d) << " " << shape_str(c.shape) << " " << qdt;
        }
      }
}

}  // namespace
}  // namespace qg
