// dynamic_fake_quantize: hand-checked qparams and values (per token asymmetric, per group
// symmetric, the rounding of the qparams to bf16), the NaN/eps/zero-row edges, the mask and
// the STE gradient, the gradient check, bad inputs, and the GPU against the CPU bit for bit
// on the recipe shapes (the torchao conformance is python/tests/test_torch_torchao_conformance.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/grad.h"
#include "runtime/gradcheck.h"
#include "tests/common/crosscheck_pins.h"
#include "tests/common/tensor_compare.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

Attrs asym(int64_t qmin, int64_t qmax, int64_t group = 0) {
  return {{"quant_min", qmin}, {"quant_max", qmax}, {"group_size", group}};
}
Attrs sym(int64_t qmin, int64_t qmax, int64_t group = 0) {
  return {{"quant_min", qmin},
          {"quant_max", qmax},
          {"group_size", group},
          {"mode", std::string("symmetric")}};
}

std::vector<bool> mask_bits(const Tensor& mask, int64_t n) {
  std::vector<bool> b;
  for (int64_t i = 0; i < n; ++i) b.push_back((mask.data<uint8_t>()[i / 8] >> (i % 8)) & 1);
  return b;
}

// Range 15 (codes -8..7) over [-1.5, 6]: scale = 7.5 x f32(1/15) rounds to 0.5 exactly, and
// zp = -8 - rint(-1.5 / 0.5) = -5. In f32 and in bf16 (every value is a bf16 value).
TEST(DynamicFakeQuantize, PerTokenAsymmetricByHand) {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    Tensor x = Tensor::from_doubles({2, 4}, {-1.5, 0.0, 6.0, 1.2, 0.0, 0.0, 0.0, 0.0}, d);
    auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, asym(-8, 7));
    EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.5, 1.1920928955078125e-07}))
        << dtype_name(d);  // the zero row takes eps (f32's epsilon, a power of two)
    EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{-5, -8}));
    // 1.2 / 0.5 = 2.4 -> code 2 - 5 -> 1.0.
    EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{-1.5, 0.0, 6.0, 1.0, 0, 0, 0, 0}));
    EXPECT_EQ(mask_bits(out[1], 8), std::vector<bool>(8, true));
  }
}

// The qparams round to the input's dtype after each step: a row [-1, 2] has the f32 scale
// 3 x f32(1/255) = 0.0117647... but the bf16 scale 0.01177978515625 (3 rounded, then the
// product rounded to 8 significant bits: 1.5058 x 2^-7 -> 193/128 x 2^-7).
TEST(DynamicFakeQuantize, Bf16QparamsRoundInBf16) {
  Tensor x = Tensor::from_doubles({1, 2}, {-1.0, 2.0}, DType::bf16);
  auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, asym(-128, 127));
  EXPECT_EQ(out[2].to_doubles()[0], 0.01177978515625);
  // -1 / 0.01177978515625 = -84.89 rounds to bf16 -85.0; zp = -128 + 85.
  EXPECT_EQ(out[3].to_doubles()[0], -43);
  Tensor xf = Tensor::from_doubles({1, 2}, {-1.0, 2.0}, DType::f32);
  auto outf = run_op(Device::cpu(), "dynamic_fake_quantize", {xf}, asym(-128, 127));
  EXPECT_EQ(static_cast<float>(outf[2].to_doubles()[0]), 3.0f * (1.0f / 255.0f));
}

// Symmetric int4 groups of 4: amax 3.75 gives scale 3.75 x f32(1/7.5) -> 0.5; 0.75 -> code 2,
// -3.75 -> rint(-7.5) = -8 (kept), 0.3 -> 1, 3.75 -> rint(7.5) = 8, clamped to 7 (mask 0).
TEST(DynamicFakeQuantize, PerGroupSymmetricByHand) {
  Tensor w = Tensor::from_doubles({1, 8}, {0.75, -3.75, 0.3, 3.75, 0, 0, 0, 0}, DType::f32);
  Attrs a = sym(-8, 7, 4);
  a.set("eps", std::ldexp(1.0, -126));
  auto out = run_op(Device::cpu(), "dynamic_fake_quantize", {w}, a);
  EXPECT_EQ(out[2].shape(), (Shape{1, 2}));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.5, std::ldexp(1.0, -126)}));
  EXPECT_EQ(out[3].to_doubles(), (std::vector<double>{0, 0}));
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1.0, -4.0, 0.5, 3.5, 0, 0, 0, 0}));
  EXPECT_EQ(mask_bits(out[1], 8),
            (std::vector<bool>{true, true, true, false, true, true, true, true}));
}

// The STE: dx = dy where the code was in range, through the graph's backward.
TEST(DynamicFakeQuantize, GradientIsTheStraightThroughEstimator) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {1, 4}});
  auto outs = g.apply("dynamic_fake_quantize", {x}, sym(-8, 7));
  ValueId loss = g.apply1("sum", {outs[0]});
  ValueId dx = grad(g, loss, {x})[0];
  Executor ex(g);
  auto got =
      ex.run({{"x", Tensor::from_doubles({1, 4}, {0.75, -3.75, 0.3, 3.75}, DType::f32)}}, {dx});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{1, 1, 1, 0}));
}

// Pinned, so that no `qat crosscheck` case goes missing unnoticed.
TEST(DynamicFakeQuantize, KeepsItsCrosscheckCases) {
  testing::expect_crosscheck_pins("dynamic_fake_quantize", 15, {});  // every output bit for bit
}

TEST(DynamicFakeQuantize, PassesTheGradientCheck) {
  const OpDef& op = OpRegistry::instance().get("dynamic_fake_quantize");
  for (const GradcheckSample& s : op.gradcheck_samples()) {
    GradcheckResult r = gradcheck(op, s);
    EXPECT_TRUE(r.passed) << s.label << " " << r.error << " " << r.max_rel_error;
  }
}

TEST(DynamicFakeQuantize, BadInputsAreNamedErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3, 10}});
  ValueId e = g.input("e", {DType::f32, {3, 0}});
  ValueId i = g.input("i", {DType::i32, {3, 10}});
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, asym(-8, 7, 4)); },
               {"[dynamic_fake_quantize]", "'group_size' = 4", "does not divide", "[3, 10]"});
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, sym(0, 15)); },
               {"[dynamic_fake_quantize]", "symmetric", "[0, 15]"});
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, asym(7, 7)); },
               {"[dynamic_fake_quantize]", "quant_min = 7", "quant_max = 7"});
  expect_error([&] { g.apply("dynamic_fake_quantize", {e}, asym(-8, 7)); },
               {"[dynamic_fake_quantize]", "last axis", "empty"});
  expect_error([&] { g.apply("dynamic_fake_quantize", {i}, asym(-8, 7)); },
               {"[dynamic_fake_quantize]", "i32"});
  Attrs bad = asym(-8, 7);
  bad.set("eps", -1.0);
  expect_error([&] { g.apply("dynamic_fake_quantize", {x}, bad); },
               {"[dynamic_fake_quantize]", "'eps' = -1"});
  // A NaN in row 1 makes its scale NaN: an error naming the row, on the CPU and the GPU.
  Tensor v = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, kNaN, 6}, DType::f32);
  expect_error([&] { run_op(Device::cpu(), "dynamic_fake_quantize", {v}, asym(-8, 7)); },
               {"[dynamic_fake_quantize]", "scale[1] = nan", "positive and finite"});
  if (cuda_available()) {
    expect_error([&] { run_op(Device::cuda(), "dynamic_fake_quantize", {v}, asym(-8, 7)); },
                 {"dynamic_fake_quantize", "scale", "nan"});
    // The same on rows the packed team kernel takes (a whole number of 8-element packs).
    Tensor wide = Tensor::from_doubles({3, 1024}, std::vector<double>(3 * 1024, 0.25), DType::bf16);
    static_cast<uint16_t*>(wide.raw_data())[1024 + 517] = 0x7fc0;  // bf16 NaN in row 1
    expect_error([&] { run_op(Device::cuda(), "dynamic_fake_quantize", {wide}, asym(-128, 127)); },
                 {"dynamic_fake_quantize", "scale", "nan"});
  }
}

// GPU against CPU, bit for bit, every output, on the recipes' shapes and odd group lengths.
TEST(DynamicFakeQuantize, GpuMatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape shape;
    Attrs attrs;
  };
  Attrs w4 = sym(-8, 7, 32);
  w4.set("eps", std::ldexp(1.0, -126));
  const std::vector<Case> cases = {{{64, 1024}, asym(-128, 127)},
                                   {{3, 5, 2816}, asym(-128, 127)},
                                   {{96, 1024}, w4},
                                   {{7, 37}, asym(0, 255)},
                                   {{5, 12}, sym(-8, 7, 3)},
                                   // The packed team kernel's team sizes (4, 8, 16, 32 lanes
                                   // for groups of 8-32, 40-64, 72-128 and more elements),
                                   // group counts that leave teams of a warp without a group,
                                   // and a row of packs that is not a multiple of the team.
                                   {{7, 8}, asym(-128, 127)},
                                   {{7, 40}, asym(-128, 127)},
                                   {{3, 384}, sym(-8, 7, 64)},
                                   {{5, 1152}, sym(-8, 7, 128)},
                                   {{9, 768}, sym(-8, 7, 256)},
                                   {{11, 520}, asym(-128, 127)}};
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      Tensor x = testing::random_f32(c.shape, seed++).cast(d);
      auto cpu = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, c.attrs);
      auto gpu = run_op(Device::cuda(), "dynamic_fake_quantize", {x}, c.attrs);
      for (size_t k = 0; k < cpu.size(); ++k) {
        ASSERT_EQ(cpu[k].nbytes(), gpu[k].nbytes());
        EXPECT_EQ(std::memcmp(cpu[k].raw_data(), gpu[k].raw_data(), cpu[k].nbytes()), 0)
            << "output " << k << " " << dtype_name(d) << " " << shape_str(c.shape);
      }
    }
}

// The GPU's no-NaN element path (valid groups with a finite 1/scale) against the CPU on rows
// built to reach its edges: zeros of both signs, subnormals of each dtype, one-signed rows,
// values a code's half-way point apart (ties to even), the largest values each dtype holds
// within the rows' ranges, and a row at the eps floor beside a large one. 64 elements a row:
// the packed team kernel, per token and per group of 32 (symmetric int4).
TEST(DynamicFakeQuantize, GpuMatchesCpuBitForBitOnEdgeRows) {
  QG_REQUIRE_GPU();
  const int64_t n = 64;
  std::vector<std::vector<double>> rows(7, std::vector<double>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i);
    rows[0][i] = i % 2 ? -0.0 : 0.0;
    rows[1][i] = std::ldexp(1.0 + t / 64, -130) * (i % 3 ? 1 : -1);  // f32/bf16 subnormals
    rows[2][i] = 0.5 + t / 128;                                      // positive only
    rows[3][i] = -(0.25 + t / 32);                                   // negative only
    rows[4][i] = (t - 32) * 0.5;  // with range 15.5 + 16: x * inv lands on halves
    rows[5][i] = (i % 2 ? -30000.0 : 30000.0) * (t + 1) / n;  // f16: a finite range
    rows[6][i] = i == 0 ? 1e-6 : (i % 5 ? 1e-12 : -1e-12);    // tiny against eps
  }
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    for (const Attrs& attrs : {asym(-128, 127), asym(-8, 7, 32), sym(-8, 7, 32)}) {
      Tensor x = Tensor::from_doubles({static_cast<int64_t>(rows.size()), n}, flat, d);
      auto cpu = run_op(Device::cpu(), "dynamic_fake_quantize", {x}, attrs);
      auto gpu = run_op(Device::cuda(), "dynamic_fake_quantize", {x}, attrs);
      for (size_t k = 0; k < cpu.size(); ++k)
        EXPECT_EQ(testing::first_difference(cpu[k], gpu[k]), "")
            << "output " << k << " " << dtype_name(d);
    }
}

}  // namespace
}  // namespace qg
