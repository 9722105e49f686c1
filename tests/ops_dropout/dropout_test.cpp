// dropout and dropout_backward: the generator against Philox-4x32-10's published known-answer
// vectors, the drop statistics, fresh masks per step, reproducibility per seed, eval mode,
// p = 0, the 1 / (1 - p) scale of both directions, bad inputs, and CPU == GPU bit for bit.
// There is no PyTorch conformance script for dropout: torch draws its masks from a
// different generator (mt19937 / Philox with its own counter layout), so only the
// distribution and the scale can agree, and those are tested here.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "ops/common/philox.h"
#include "ops/dropout/dropout_reference.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::same_bits;

// The Random123 known-answer vectors of philox4x32 with 10 rounds.
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    philox::Words counter;
    uint32_t k0, k1;
    philox::Words expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    philox::Words got = philox::philox4x32_10(k.counter, k.k0, k.k1);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got.v[j], k.expected.v[j]) << "word " << j;
  }
}

// A graph x -> dropout -> (y, mask) on one executor.
struct DropoutGraph {
  Graph g;
  ValueId x;
  std::vector<ValueId> out;
  NodeId node;
  std::unique_ptr<Executor> ex;
  DropoutGraph(const Shape& shape, const Attrs& attrs, DType dtype = DType::f32,
               Device device = Device::cpu()) {
    x = g.input("x", {dtype, shape});
    out = g.apply("dropout", {x}, attrs);
    node = g.num_nodes() - 1;
    ex = std::make_unique<Executor>(g, device);
  }
  std::vector<Tensor> run(const Tensor& xv) {
    auto r = ex->run({{"x", xv}}, out);
    for (Tensor& t : r) t = t.to(Device::cpu());
    return r;
  }
};

Tensor ones(int64_t n, DType dtype = DType::f32) {
  return Tensor::from_doubles({n}, std::vector<double>(static_cast<size_t>(n), 1.0), dtype);
}

TEST(Dropout, DropFractionWithinFiveSigmaAndScaleOfKeptElements) {
  const int64_t n = 1000000;
  for (double p : {0.1, 0.5, 0.9}) {
    DropoutGraph d({n}, {{"p", p}, {"seed", int64_t{7}}});
    auto r = d.run(ones(n));
    const uint8_t* m = r[1].data<uint8_t>();
    const float* y = r[0].data<float>();
    const float kept = static_cast<float>(1.0 / (1.0 - p));
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; ++i) {
      dropped += m[i] == 0;
      ASSERT_EQ(y[i], m[i] ? kept : 0.0f) << i;
    }
    const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(n), p, 5 * sigma) << p;
  }
}

TEST(Dropout, EachStepDrawsAFreshMaskAndCountsSteps) {
  DropoutGraph d({4096}, {{"p", 0.5}});
  auto first = d.run(ones(4096));
  auto second = d.run(ones(4096));
  EXPECT_FALSE(same_bits(first[1], second[1]));
  EXPECT_EQ(d.ex->state(d.node, "step").at(0), 2);
  // Each step's mask is the generator's for that step.
  std::vector<uint8_t> want = dropout_reference_mask(4096, 0.5, 0, 1);
  EXPECT_EQ(std::vector<uint8_t>(second[1].data<uint8_t>(), second[1].data<uint8_t>() + 4096),
            want);
}

TEST(Dropout, SameSeedSameMasksOnTwoExecutors) {
  DropoutGraph a({1000}, {{"p", 0.3}, {"seed", int64_t{42}}});
  DropoutGraph b({1000}, {{"p", 0.3}, {"seed", int64_t{42}}});
  DropoutGraph c({1000}, {{"p", 0.3}, {"seed", int64_t{43}}});
  for (int step = 0; step < 3; ++step) {
    auto ra = a.run(ones(1000)), rb = b.run(ones(1000)), rc = c.run(ones(1000));
    EXPECT_TRUE(same_bits(ra[1], rb[1])) << step;
    EXPECT_TRUE(same_bits(ra[0], rb[0])) << step;
    EXPECT_FALSE(same_bits(ra[1], rc[1])) << step;
  }
}

TEST(Dropout, EvalModeIsTheIdentityAndKeepsTheStep) {
  DropoutGraph d({5}, {{"p", 0.5}});
  d.ex->set_training(false);
  Tensor x = Tensor::from_doubles({5}, {1.5, -2, 0, 3.25, NAN}, DType::f32);
  auto r = d.run(x);
  EXPECT_TRUE(same_bits(r[0], x));
  EXPECT_EQ(r[1].to_doubles(), (std::vector<double>(5, 1.0)));
  EXPECT_EQ(d.ex->state(d.node, "step").at(0), 0);
}

TEST(Dropout, PZeroIsTheIdentity) {
  DropoutGraph d({6}, {{"p", 0.0}}, DType::f64);
  Tensor x = Tensor::from_doubles({6}, {1.5, -2, 0, 3.25, 1e300, -7e-300}, DType::f64);
  auto r = d.run(x);
  EXPECT_TRUE(same_bits(r[0], x));
  EXPECT_EQ(r[1].to_doubles(), (std::vector<double>(6, 1.0)));
}

TEST(Dropout, BackwardIsDyTimesMaskOverOneMinusP) {
  // p = 0.75: kept gradients are multiplied by exactly 4, dropped ones are 0.
  Graph g;
  ValueId x = g.input("x", {DType::f64, {64}});
  ValueId dy = g.input("dy", {DType::f64, {64}});
  auto out = g.apply("dropout", {x}, {{"p", 0.75}, {"seed", int64_t{5}}});
  ValueId dx = grad_with_seed(g, out[0], dy, {x})[0];
  Executor ex(g);
  std::vector<double> dyv(64);
  for (int i = 0; i < 64; ++i) dyv[i] = 0.5 + i;
  auto r =
      ex.run({{"x", ones(64, DType::f64)}, {"dy", Tensor::from_doubles({64}, dyv, DType::f64)}},
             {dx, out[1]});
  int kept = 0;
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(r[0].at(i), r[1].at(i) ? 4.0 * dyv[i] : 0.0) << i;
    kept += r[1].at(i) != 0;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 64);
}

TEST(Dropout, EvalModeBackwardIsTheIdentity) {
  // The forward is y = x in eval mode, so dx = dy (no 1 / (1 - p)).
  Graph g;
  ValueId x = g.input("x", {DType::f64, {8}});
  ValueId dy = g.input("dy", {DType::f64, {8}});
  auto out = g.apply("dropout", {x}, {{"p", 0.75}});
  ValueId dx = grad_with_seed(g, out[0], dy, {x})[0];
  Executor ex(g);
  ex.set_training(false);
  Tensor dyv = Tensor::from_doubles({8}, {1, -2, 3, -4, 5, -6, 7, -8}, DType::f64);
  auto r = ex.run({{"x", ones(8, DType::f64)}, {"dy", dyv}}, {dx});
  EXPECT_EQ(r[0].to_doubles(), dyv.to_doubles());
}

TEST(DropoutErrors, POutsideTheUnitIntervalAndNonFloatInput) {
  for (double p : {1.0, -0.1, 1.5})
    expect_error(
        [p] {
          Graph g;
          g.apply("dropout", {g.input("x", {DType::f32, {3}})}, {{"p", p}});
        },
        {"dropout", "'p'", "[0, 1)"});
  expect_error(
      [] {
        Graph g;
        g.apply("dropout", {g.input("x", {DType::i32, {3}})});
      },
      {"[dropout]", "floating point", "i32"});
  expect_error(
      [] {
        Graph g;
        g.apply("dropout_backward",
                {g.input("dy", {DType::f32, {3}}), g.input("m", {DType::f32, {3}})});
      },
      {"[dropout_backward]", "mask", "u8"});
}

TEST(DropoutGpu, CpuAndGpuDrawTheSameMasksBitForBit) {
  QG_REQUIRE_GPU();
  const int64_t n = 100003;  // not a multiple of 4: the last counter's words are partly used
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.001 * static_cast<double>(i)) * 3;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor x = Tensor::from_doubles({n}, v, dtype);
    DropoutGraph cpu({n}, {{"p", 0.37}, {"seed", int64_t{99}}}, dtype, Device::cpu());
    DropoutGraph gpu({n}, {{"p", 0.37}, {"seed", int64_t{99}}}, dtype, Device::cuda());
    for (int step = 0; step < 3; ++step) {
      auto rc = cpu.run(x), rg = gpu.run(x);
      EXPECT_TRUE(same_bits(rc[1], rg[1])) << dtype_name(dtype) << " step " << step;
      EXPECT_TRUE(same_bits(rc[0], rg[0])) << dtype_name(dtype) << " step " << step;
      Tensor dy = rc[0];
      auto dc = testing::run_op(Device::cpu(), "dropout_backward", {dy, rc[1]}, {{"p", 0.37}});
      auto dg = testing::run_op(Device::cuda(), "dropout_backward", {dy, rc[1]}, {{"p", 0.37}});
      EXPECT_TRUE(same_bits(dc[0], dg[0])) << dtype_name(dtype);
    }
    gpu.ex->set_training(false);
    auto re = gpu.run(x);
    EXPECT_TRUE(same_bits(re[0], x));
    EXPECT_EQ(re[1].to_doubles(), std::vector<double>(static_cast<size_t>(n), 1.0));
  }
}

}  // namespace
}  // namespace qg
