// rope: rotations worked out by hand (head_dim 2 and 4, where the angle is the position and
// position * f32(1/100)), torch 1.13's bf16 and f16 results of transformers' arithmetic
// pinned (each product rounds to the dtype: rounding once would change elements 8, 13 and
// 23 in bf16), the inverse undoing the forward, the gradient through the graph, the
// gradient check, bad inputs, the pinned crosscheck cases, and the GPU against the CPU (the
// PyTorch conformance is tests/conformance/rope_conformance.py).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "runtime/crosscheck.h"
#include "runtime/gradcheck.h"
#include "tests/common/crosscheck_pins.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

Tensor positions(Shape s, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(std::move(s), std::move(v));
}

Attrs theta(double t, bool inverse = false) {
  return {{"rope_theta", t}, {"inverse", inverse}};
}

// head_dim 2: one frequency, inv_freq = 1, so (x0, x1) turns by the position in radians.
// (1, 0) at 1 rad -> (cos 1, sin 1); (0, 1) at 2 rad -> (-sin 2, cos 2); position 0 -> x.
// The f32 values of cos and sin (correctly rounded).
TEST(Rope, RotatesPairsByThePositionByHand) {
  Tensor x = Tensor::from_doubles({1, 1, 3, 2}, {1, 0, 0, 1, 0.5, -2}, DType::f32);
  auto y = run_op(Device::cpu(), "rope", {x, positions({1, 3}, {1, 2, 0})}, theta(1e4))[0];
  const float cos1 = 0.5403022766113281f, sin1 = 0.8414709568023682f;
  const float cos2 = -0.416146844625473f, sin2 = 0.9092974066734314f;
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{cos1, sin1, -sin2, cos2, 0.5, -2}));
}

// head_dim 4, theta 1e4: inv_freq = [1, 1 / f32(1e4^0.5)] = [1, f32(0.01)]; element j pairs
// with j + 2. At position 2 the angles are 2 and 2 * f32(0.01) = 0.019999999552965164 (f32).
TEST(Rope, SecondFrequencyByHand) {
  Tensor x = Tensor::from_doubles({1, 1, 1, 4}, {1, 1, 0, 0}, DType::f32);
  auto y = run_op(Device::cpu(), "rope", {x, positions({1, 1}, {2})}, theta(1e4))[0];
  const float cos2 = -0.416146844625473f, sin2 = 0.9092974066734314f;
  const float cos_a = 0.9998000264167786f, sin_a = 0.019998665899038315f;
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{cos2, cos_a, sin2, sin_a}));
}

// torch 1.13 (CPU): LlamaRotaryEmbedding's f32 cos/sin cast to the dtype, then
// x * cos + rotate_half(x) * sin in bf16 / f16, head_dim 8, positions 0, 5, 1000.
TEST(Rope, MatchesTorchInBf16AndF16) {
  const std::vector<double> x = {
      -1.296875,   -0.9296875,     -0.55859375, -0.1904296875, 0.1796875,   0.55078125,
      0.921875,    1.2890625,      -1.1875,     -0.8203125,    -0.44921875, -0.080078125,
      0.2890625,   0.66015625,     1.03125,     1.3984375,     -1.078125,   -0.7109375,
      -0.33984375, 0.030029296875, 0.400390625, 0.76953125,    1.140625,    1.5078125};
  const std::vector<double> bf16_y = {
      -1.296875, -0.9296875,  -0.55859375, -0.1904296875, 0.1796875,  0.55078125,
      0.921875,  1.2890625,   -0.05859375, -1.0390625,    -0.5,       -0.0869140625,
      1.21875,   0.189453125, 1.0078125,   1.3984375,     -0.9375,    -0.22265625,
      0.90625,   -1.25,       -0.66796875, 1.0234375,     -0.7734375, 0.8359375};
  const std::vector<double> f16_y = {
      -1.296875,    -0.9296875,        -0.55859375,   -0.1904296875,   0.1796875,
      0.55078125,   0.921875,          1.2890625,     -0.059814453125, -1.0361328125,
      -0.5,         -0.08709716796875, 1.220703125,   0.185791015625,  1.0068359375,
      1.3984375,    -0.9375,           -0.2236328125, 0.90576171875,   -1.251953125,
      -0.666015625, 1.0234375,         -0.7724609375, 0.84033203125};
  for (auto [d, want] : {std::pair{DType::bf16, bf16_y}, std::pair{DType::f16, f16_y}}) {
    auto y = run_op(Device::cpu(), "rope",
                    {Tensor::from_doubles({1, 1, 3, 8}, x, d), positions({1, 3}, {0, 5, 1000})},
                    theta(1e4))[0];
    EXPECT_EQ(y.to_doubles(), want) << dtype_name(d);
  }
}

// The inverse rotation undoes the forward, per batch row with its own positions, up to
// c^2 + s^2 = 1: cos and sin are f32 values even for f64 x (as in transformers), so in f64
// the round trip is off by their f32 rounding, about 2^-24, and no more.
TEST(Rope, InverseUndoesTheForward) {
  Tensor x = testing::random_f32({2, 3, 5, 16}, 7).cast(DType::f64);
  Tensor p = positions({2, 5}, {0, 1, 2, 3, 4, 9, 70, 300, 4000, 50000});
  Tensor y = run_op(Device::cpu(), "rope", {x, p}, theta(1e4))[0];
  Tensor back = run_op(Device::cpu(), "rope", {y, p}, theta(1e4, true))[0];
  EXPECT_LT(testing::relative_error(back, x), 2e-7);
  EXPECT_GT(testing::relative_error(y, x), 0.1);  // it did rotate
}

// Through the graph, d/dx sum(rope(x) * c) is the inverse rotation of c.
TEST(Rope, GradientIsTheInverseRotation) {
  Tensor p = positions({1, 3}, {3, 1, 8});
  Tensor cv = testing::random_f32({2, 2, 3, 6}, 3).cast(DType::f64);
  Graph g;
  ValueId x = g.input("x", {DType::f64, {2, 2, 3, 6}});
  ValueId pos = g.input("p", {DType::i64, {1, 3}});
  ValueId c = g.input("c", {DType::f64, {2, 2, 3, 6}});
  ValueId y = g.apply1("rope", {x, pos}, theta(500));
  ValueId loss = g.apply1("sum", {g.apply1("mul", {y, c})});
  ValueId dx = grad(g, loss, {x})[0];
  Executor ex(g);
  auto got = ex.run(
      {{"x", testing::random_f32({2, 2, 3, 6}, 4).cast(DType::f64)}, {"p", p}, {"c", cv}}, {dx});
  Tensor want = run_op(Device::cpu(), "rope", {cv, p}, theta(500, true))[0];
  EXPECT_TRUE(testing::same_bits(got[0], want));
}

TEST(Rope, PassesTheGradientCheck) {
  const OpDef& op = OpRegistry::instance().get("rope");
  for (const GradcheckSample& s : op.gradcheck_samples()) {
    GradcheckResult r = gradcheck(op, s);
    EXPECT_TRUE(r.passed) << s.label << " " << r.error << " " << r.max_rel_error;
  }
}

// Pinned, so that no `qat crosscheck` case goes missing unnoticed.
TEST(Rope, KeepsItsCrosscheckCases) {
  testing::expect_crosscheck_pins("rope", 6, {-1});  // cos/sin of two libms
}

TEST(Rope, BadInputsAreNamedErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 4, 5, 8}});
  ValueId p = g.input("p", {DType::i64, {2, 5}});
  ValueId x3 = g.input("x3", {DType::f32, {4, 5, 8}});
  ValueId odd = g.input("odd", {DType::f32, {2, 4, 5, 7}});
  ValueId wide = g.input("wide", {DType::f32, {1, 1, 5, 514}});
  ValueId xi = g.input("xi", {DType::i32, {2, 4, 5, 8}});
  ValueId p32 = g.input("p32", {DType::i32, {2, 5}});
  ValueId p_seq = g.input("p_seq", {DType::i64, {2, 6}});
  ValueId p_batch = g.input("p_batch", {DType::i64, {3, 5}});
  ValueId p_flat = g.input("p_flat", {DType::i64, {5}});
  expect_error(
      [&] {
        g.apply("rope", {x3, p});
      },
      {"[rope]", "x must be [batch, heads, seq, head_dim]", "f32[4, 5, 8]"});
  expect_error([&] { g.apply("rope", {odd, p}); }, {"[rope]", "head_dim = 7", "even"});
  expect_error([&] { g.apply("rope", {wide, p}); }, {"[rope]", "head_dim = 514", "512"});
  expect_error([&] { g.apply("rope", {xi, p}); }, {"[rope]", "i32"});
  expect_error([&] { g.apply("rope", {x, p32}); }, {"[rope]", "position_ids must be i64", "i32"});
  for (ValueId bad : {p_seq, p_batch, p_flat})
    expect_error(
        [&] {
          g.apply("rope", {x, bad});
        },
        {"[rope]", "position_ids must be [2, 5] or [1, 5]", g.value(bad).type.str()});
  for (double t : {0.0, -1.0, 1e39, std::numeric_limits<double>::infinity()})
    expect_error(
        [&] {
          g.apply("rope", {x, p}, theta(t));
        },
        {"[rope]", "'rope_theta' =", "positive and finite"});
}

// GPU against CPU to rounding (the crosscheck rule: cos/sin of another libm), forward and
// inverse, every dtype, Llama's head dims and positions shared by the batch.
TEST(Rope, GpuMatchesCpu) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape x;
    Tensor p;
  };
  std::vector<int64_t> long_pos(16);
  for (int i = 0; i < 16; ++i) long_pos[i] = 100000 + 37 * i;
  const std::vector<Case> cases = {
      {{2, 16, 8, 128}, positions({2, 8}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})},
      {{3, 8, 4, 64}, positions({1, 4}, {5, 0, 1023, 4095})},
      {{1, 2, 16, 128}, positions({1, 16}, long_pos)},
      {{2, 3, 5, 2}, positions({1, 5}, {0, 1, 2, 3, 4})}};
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64})
      for (bool inverse : {false, true}) {
        Tensor x = testing::random_f32(c.x, seed++).cast(d);
        Tensor cpu = run_op(Device::cpu(), "rope", {x, c.p}, theta(5e5, inverse))[0];
        Tensor gpu = run_op(Device::cuda(), "rope", {x, c.p}, theta(5e5, inverse))[0];
        EXPECT_LE(testing::relative_error(gpu, cpu), compare_rule("rope", 0, d).tolerance)
            << dtype_name(d) << " " << shape_str(c.x) << " inverse " << inverse;
      }
}

}  // namespace
}  // namespace qg
