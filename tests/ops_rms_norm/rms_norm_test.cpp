// rms_norm: values worked out by hand (a row whose mean square plus eps is 16), torch 1.13's
// bf16 and f16 results of LlamaRMSNorm's arithmetic pinned (the cast back to x's dtype before
// the weight changes the last bit of some elements), the backward by hand and through the
// graph, the gradient check, bad inputs, the pinned crosscheck cases, and the GPU against the
// CPU bit for bit (the PyTorch conformance is tests/conformance/rms_norm_conformance.py).
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "runtime/gradcheck.h"
#include "tests/common/crosscheck_pins.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

Attrs eps(double e) {
  return {{"eps", e}};
}

// Row [3, 4]: mean square 12.5, + eps 3.5 = 16, rstd 1/4; h = [0.75, 1], y = h * [2, -1].
// Row [0, 0]: rstd = 1 / sqrt(3.5), y = 0. Exact in every dtype.
TEST(RmsNorm, ForwardByHand) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    Tensor x = Tensor::from_doubles({2, 2}, {3, 4, 0, 0}, d);
    Tensor w = Tensor::from_doubles({2}, {2, -1}, d);
    auto out = run_op(Device::cpu(), "rms_norm", {x, w}, eps(3.5));
    EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1.5, -1.0, 0.0, 0.0})) << dtype_name(d);
    EXPECT_EQ(out[1].dtype(), d == DType::f64 ? DType::f64 : DType::f32);
    EXPECT_EQ(out[1].shape(), (Shape{2}));
    EXPECT_EQ(out[1].to_doubles()[0], 0.25);
    const double r =
        d == DType::f64 ? 1.0 / std::sqrt(3.5) : static_cast<double>(1.0f / std::sqrt(3.5f));
    EXPECT_EQ(out[1].to_doubles()[1], r) << dtype_name(d);
  }
}

// The same row with dy = [1, 1]: g = dy * w = [2, -1], s = sum g x = 2, (s / d) rstd^3 = 1/64,
// dx = rstd g - x / 64 = [29/64, -20/64]; dweight = dy * h = [0.75, 1].
TEST(RmsNorm, BackwardByHand) {
  for (DType d : {DType::f32, DType::f64, DType::bf16}) {
    Tensor dy = Tensor::from_doubles({1, 2}, {1, 1}, d);
    Tensor x = Tensor::from_doubles({1, 2}, {3, 4}, d);
    Tensor w = Tensor::from_doubles({2}, {2, -1}, d);
    Tensor rstd = Tensor::from_doubles({1}, {0.25}, d == DType::f64 ? DType::f64 : DType::f32);
    auto out = run_op(Device::cpu(), "rms_norm_backward", {dy, x, w, rstd});
    EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{29.0 / 64, -20.0 / 64})) << dtype_name(d);
    EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{0.75, 1.0})) << dtype_name(d);
  }
}

// torch 1.13 (CPU), transformers' LlamaRMSNorm arithmetic on bf16 / f16 x and weight, eps
// 1e-5: x.float(), pow(2).mean(-1), x * rsqrt(var + eps), .to(dtype), weight * that. Without
// the cast before the weight, bf16 elements 2, 7 and 15 would differ.
TEST(RmsNorm, MatchesTorchInBf16AndF16) {
  const std::vector<double> x = {-1.296875, -0.9296875, -0.55859375,    -0.1904296875,
                                 0.1796875, 0.55078125, 0.921875,       1.2890625,
                                 2.09375,   1.5703125,  -0.02001953125, -2.671875,
                                 -6.375,    -11.125,    -17.0,          -23.875};
  const std::vector<double> w = {0.8984375, 0.96875, 1.0390625, 1.109375,
                                 1.1796875, 1.25,    1.3203125, 1.390625};
  const std::vector<double> bf16_y = {-1.375,
                                      -1.0625,
                                      -0.6875,
                                      -0.2490234375,
                                      0.25,
                                      0.8125,
                                      1.4375,
                                      2.125,
                                      0.1650390625,
                                      0.1337890625,
                                      -0.00182342529296875,
                                      -0.259765625,
                                      -0.66015625,
                                      -1.21875,
                                      -1.96875,
                                      -2.90625};
  const std::vector<double> f16_y = {
      -1.3759765625,   -1.0634765625,   -0.68505859375,         -0.249267578125,
      0.250244140625,  0.8125,          1.4365234375,           2.115234375,
      0.1651611328125, 0.1336669921875, -0.0018262863159179688, -0.26025390625,
      -0.66064453125,  -1.2216796875,   -1.9716796875,          -2.9140625};
  for (auto [d, want] : {std::pair{DType::bf16, bf16_y}, std::pair{DType::f16, f16_y}}) {
    auto out =
        run_op(Device::cpu(), "rms_norm",
               {Tensor::from_doubles({2, 8}, x, d), Tensor::from_doubles({8}, w, d)}, eps(1e-5));
    EXPECT_EQ(out[0].to_doubles(), want) << dtype_name(d);
  }
}

// Through the graph: the backward rule feeds rms_norm_backward, whose dx is the derivative of
// sum(y * c) and dweight the sum of c * h over the rows.
TEST(RmsNorm, GradientThroughTheGraph) {
  Graph g;
  ValueId x = g.input("x", {DType::f64, {1, 2}});
  ValueId w = g.input("w", {DType::f64, {2}});
  ValueId y = g.apply("rms_norm", {x, w}, eps(3.5))[0];
  ValueId loss = g.apply1("sum", {y});
  auto grads = grad(g, loss, {x, w});
  Executor ex(g);
  auto got = ex.run({{"x", Tensor::from_doubles({1, 2}, {3, 4}, DType::f64)},
                     {"w", Tensor::from_doubles({2}, {2, -1}, DType::f64)}},
                    {grads[0], grads[1]});
  EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{29.0 / 64, -20.0 / 64}));
  EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{0.75, 1.0}));
}

TEST(RmsNorm, PassesTheGradientCheck) {
  const OpDef& op = OpRegistry::instance().get("rms_norm");
  for (const GradcheckSample& s : op.gradcheck_samples()) {
    GradcheckResult r = gradcheck(op, s);
    EXPECT_TRUE(r.passed) << s.label << " " << r.error << " " << r.max_rel_error;
  }
}

// Pinned, so that no `qat crosscheck` case goes missing unnoticed.
TEST(RmsNorm, KeepsItsCrosscheckCases) {
  testing::expect_crosscheck_pins("rms_norm", 9, {});  // every output bit for bit
  testing::expect_crosscheck_pins("rms_norm_backward", 0, {});
}

TEST(RmsNorm, BadInputsAreNamedErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3, 8}});
  ValueId w8 = g.input("w8", {DType::f32, {8}});
  ValueId w4 = g.input("w4", {DType::f32, {4}});
  ValueId w8h = g.input("w8h", {DType::bf16, {8}});
  ValueId empty = g.input("e", {DType::f32, {3, 0}});
  ValueId scalar = g.input("s", {DType::f32, {}});
  ValueId xi = g.input("xi", {DType::i32, {3, 8}});
  expect_error(
      [&] {
        g.apply("rms_norm", {x, w4});
      },
      {"[rms_norm]", "weight must be [8]", "f32[4]", "f32[3, 8]"});
  expect_error([&] { g.apply("rms_norm", {x, w8h}); }, {"[rms_norm]", "bf16", "f32"});
  expect_error([&] { g.apply("rms_norm", {empty, w8}); }, {"[rms_norm]", "non-empty last axis"});
  expect_error([&] { g.apply("rms_norm", {scalar, w8}); }, {"[rms_norm]", "non-empty last axis"});
  expect_error([&] { g.apply("rms_norm", {xi, w8}); }, {"[rms_norm]", "i32"});
  expect_error([&] { g.apply("rms_norm", {x, w8}, eps(0.0)); }, {"[rms_norm]", "'eps' = 0", "> 0"});
  expect_error([&] { g.apply("rms_norm", {x, w8}, eps(-1e-5)); }, {"[rms_norm]", "'eps' = -1e-05"});
  ValueId dy = g.input("dy", {DType::f32, {3, 8}});
  ValueId dy2 = g.input("dy2", {DType::f32, {2, 8}});
  ValueId r3 = g.input("r3", {DType::f32, {3}});
  ValueId r3d = g.input("r3d", {DType::f64, {3}});
  expect_error(
      [&] {
        g.apply("rms_norm_backward", {dy2, x, w8, r3});
      },
      {"[rms_norm_backward]", "dy f32[2, 8] must match x f32[3, 8]"});
  expect_error(
      [&] {
        g.apply("rms_norm_backward", {dy, x, w8, r3d});
      },
      {"[rms_norm_backward]", "rstd must be f32[3]", "f64[3]"});
}

// GPU against CPU, bit for bit, forward and backward, every dtype; rows from 1 to 2816
// elements (short rows leave warp lanes idle), enough rows for several dweight chunks, and
// [4200, 40]: 132 chunks, so the fold stages three tiles of chunks (the last one partial) over
// two blocks of columns (the second partial).
TEST(RmsNorm, GpuMatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  const std::vector<Shape> shapes = {{64, 1024}, {3, 5, 2816}, {7, 5},
                                     {600, 64},  {2, 1},       {4200, 40}};
  uint32_t seed = 1;
  for (const Shape& s : shapes)
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const int64_t dim = s.back();
      Tensor x = testing::random_f32(s, seed++).cast(d);
      Tensor w = testing::random_f32({dim}, seed++).cast(d);
      Tensor dy = testing::random_f32(s, seed++).cast(d);
      auto cpu = run_op(Device::cpu(), "rms_norm", {x, w}, eps(1e-5));
      auto gpu = run_op(Device::cuda(), "rms_norm", {x, w}, eps(1e-5));
      for (size_t k = 0; k < cpu.size(); ++k)
        EXPECT_TRUE(same_bits(cpu[k], gpu[k]))
            << "rms_norm output " << k << " " << dtype_name(d) << " " << shape_str(s);
      auto cpu_b = run_op(Device::cpu(), "rms_norm_backward", {dy, x, w, cpu[1]});
      auto gpu_b = run_op(Device::cuda(), "rms_norm_backward", {dy, x, w, cpu[1]});
      for (size_t k = 0; k < cpu_b.size(); ++k)
        EXPECT_TRUE(same_bits(cpu_b[k], gpu_b[k]))
            << "rms_norm_backward output " << k << " " << dtype_name(d) << " " << shape_str(s);
    }
}

}  // namespace
}  // namespace qg
