// int8_matmul and int8_matmul_ste: hand-checked results, the order of roundings the contract
// fixes (int8_matmul_math.h), the STE backward as the float GEMM's, bad inputs as named errors,
// and the GPU kernel bit for bit against the CPU on ragged and Llama-sized shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "autograd/grad.h"
#include "core/half.h"
#include "ops/int8_matmul/int8_matmul_math.h"
#include "runtime/gradcheck.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

Tensor i8(const Shape& s, const std::vector<int>& v) {
  std::vector<int8_t> c(v.begin(), v.end());
  return Tensor::from_vector<int8_t>(s, c);
}
Tensor i32(const Shape& s, const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(s, v);
}
Tensor f32(const Shape& s, const std::vector<float>& v) {
  return Tensor::from_vector<float>(s, v);
}

// One row of K = 64 codes: `first` in the first group of 32, `second` in the second.
std::vector<int> two_groups(int first, int second) {
  std::vector<int> v(64, first);
  std::fill(v.begin() + 32, v.end(), second);
  return v;
}

Attrs group(int64_t g, const std::string& out = "f32") {
  return {{"group_size", g}, {"out_dtype", out}};
}

TEST(Int8Matmul, ByHand) {
  // Row 0: a = 2 | -1, zero 1: (a - z) = 1 | -2. Weight row: 3 | 1, scales 0.5 | 0.25.
  // p = 32 * 1 * 3 = 96, then 32 * -2 * 1 = -64; acc = 96 * 0.5 = 48, then 48 - 16 = 32;
  // y = 32 * 0.1f. Row 1: a = 0 everywhere, zero -5: (a - z) = 5; p = 5 * 32 * 3 = 480 and
  // 5 * 32 = 160; acc = 240 + 40 = 280; y = 280 * 0.5.
  std::vector<int> a = two_groups(2, -1), a1(64, 0);
  a.insert(a.end(), a1.begin(), a1.end());
  auto y = run_op(Device::cpu(), "int8_matmul",
                  {i8({2, 64}, a), f32({2}, {0.1f, 0.5f}), i32({2}, {1, -5}),
                   i8({1, 64}, two_groups(3, 1)), f32({1, 2}, {0.5f, 0.25f})},
                  group(32));
  ASSERT_EQ(y[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(y[0].data<float>()[0], 32.0f * 0.1f);
  EXPECT_EQ(y[0].data<float>()[1], 140.0f);
}

TEST(Int8Matmul, EachGroupIsOneFusedMultiplyAdd) {
  // Group 0 leaves acc = -1 (p = -1, scale 1). Group 1 has p = 3 and scale s = f32(1/3):
  // fma(3, s, -1) = 3s - 1 = 2^-25 exactly, where rounding 3s first (to 1.0f) would give 0.
  std::vector<int> a(64, 1), w(64, 0);
  w[0] = -1;
  w[32] = 3;
  const float third = 1.0f / 3.0f;
  auto y = run_op(
      Device::cpu(), "int8_matmul",
      {i8({1, 64}, a), f32({1}, {1.0f}), i32({1}, {0}), i8({1, 64}, w), f32({1, 2}, {1.0f, third})},
      group(32));
  EXPECT_EQ(y[0].data<float>()[0], std::ldexp(1.0f, -25));
  EXPECT_EQ(y[0].data<float>()[0], std::fma(3.0f, third, -1.0f));
}

TEST(Int8Matmul, PerChannelAndNarrowOutputsRoundOnce) {
  // Per channel (group 0 = all of K): p = 64 * 127 * 127 = 1032256, one scale per row.
  std::vector<int> a(64, 127), w(64, 127);
  const float sa = 0.0123f, sw = 0.0071f;
  const float f = (static_cast<float>(64 * 127 * 127) * sw) * sa;
  for (const std::string& out : {"f32", "bf16", "f16", "f64"}) {
    SCOPED_TRACE(out);
    auto y = run_op(Device::cpu(), "int8_matmul",
                    {i8({1, 64}, a), f32({1}, {sa}), i32({1}, {0}), i8({1, 64}, w), f32({1}, {sw})},
                    group(0, out));
    ASSERT_EQ(y[0].dtype(), dtype_from_name(out));
    EXPECT_EQ(y[0].at(0), Tensor::from_vector<float>({1}, {f}).cast(y[0].dtype()).at(0));
  }
}

// Random operands of the shapes the language-model recipes use.
struct Operands {
  Tensor a, a_scale, a_zero, w, w_scale;
};
Operands random_operands(int64_t m, int64_t n, int64_t k, int64_t g, int wmax, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-128, 127), wcode(-wmax - 1, wmax);
  std::uniform_real_distribution<float> scale(1e-3f, 0.2f);
  const int64_t groups = k / (g == 0 ? k : g);
  std::vector<int8_t> a(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (auto& v : a) v = static_cast<int8_t>(code(rng));
  for (auto& v : w) v = static_cast<int8_t>(wcode(rng));
  std::vector<float> sa(static_cast<size_t>(m)), sw(static_cast<size_t>(n * groups));
  std::vector<int32_t> za(static_cast<size_t>(m));
  for (auto& v : sa) v = scale(rng);
  for (auto& v : sw) v = scale(rng);
  for (auto& v : za) v = code(rng);
  return {Tensor::from_vector<int8_t>({m, k}, a), f32({m}, sa), i32({m}, za),
          Tensor::from_vector<int8_t>({n, k}, w), f32({n, groups}, sw)};
}

TEST(Int8Matmul, MatchesTheContractInDoubleWhereThatIsExact) {
  // With scales of powers of two and few groups every step of the contract is exact, so the
  // result is the real-valued product: sum_g sw * sum_k (a - za) * w, times sa.
  Operands o = random_operands(5, 3, 96, 32, 7, 7);
  for (int64_t i = 0; i < 5; ++i)
    o.a_scale.data<float>()[i] = std::ldexp(1.0f, -static_cast<int>(i));
  for (int64_t i = 0; i < 9; ++i)
    o.w_scale.data<float>()[i] = std::ldexp(1.0f, -3 - static_cast<int>(i % 4));
  auto y =
      run_op(Device::cpu(), "int8_matmul", {o.a, o.a_scale, o.a_zero, o.w, o.w_scale}, group(32));
  for (int64_t m = 0; m < 5; ++m)
    for (int64_t n = 0; n < 3; ++n) {
      double want = 0;
      for (int64_t k = 0; k < 96; ++k)
        want += (o.a.at(m * 96 + k) - o.a_zero.at(m)) * o.w.at(n * 96 + k) *
                o.w_scale.at(n * 3 + k / 32);
      EXPECT_EQ(y[0].at(m * 3 + n), want * o.a_scale.at(m)) << m << "," << n;
    }
}

TEST(Int8MatmulSte, ForwardIsTheIntegerProductAndBackwardTheFloatGemms) {
  Operands o = random_operands(4, 6, 64, 32, 7, 3);
  Graph g;
  ValueId x = g.input("x", {DType::f64, {4, 64}});
  ValueId w = g.input("w", {DType::f64, {6, 64}});
  std::vector<ValueId> codes;
  const char* names[] = {"a", "sa", "za", "wc", "sw"};
  const Tensor* ts[] = {&o.a, &o.a_scale, &o.a_zero, &o.w, &o.w_scale};
  for (int i = 0; i < 5; ++i) codes.push_back(g.input(names[i], {ts[i]->dtype(), ts[i]->shape()}));
  ValueId y = g.apply1("int8_matmul_ste", {x, w, codes[0], codes[1], codes[2], codes[3], codes[4]},
                       {{"group_size", 32}});
  ValueId loss = g.apply1("sum", {y}, {});
  auto grads = grad(g, loss, {x, w});
  Tensor xv = testing::random_f32({4, 64}, 1).cast(DType::f64);
  Tensor wv = testing::random_f32({6, 64}, 2).cast(DType::f64);
  Executor::Feeds feeds{{"x", xv}, {"w", wv}};
  for (int i = 0; i < 5; ++i) feeds[names[i]] = *ts[i];
  Executor ex(g);
  auto got = ex.run(feeds, {y, grads[0], grads[1]});
  auto want = run_op(Device::cpu(), "int8_matmul", {o.a, o.a_scale, o.a_zero, o.w, o.w_scale},
                     group(32, "f64"));
  EXPECT_TRUE(same_bits(got[0], want[0]));
  // d(sum y)/dx = ones @ w, d/dw = ones^T @ x: column sums.
  for (int64_t k = 0; k < 64; ++k) {
    double dx = 0, dw = 0;
    for (int64_t n = 0; n < 6; ++n) dx += wv.at(n * 64 + k);
    for (int64_t m = 0; m < 4; ++m) dw += xv.at(m * 64 + k);
    EXPECT_NEAR(got[1].at(k), dx, 1e-12);
    EXPECT_NEAR(got[2].at(k), dw, 1e-12);
  }
}

TEST(Int8MatmulSte, PassesTheGradientCheck) {
  const OpDef* def = OpRegistry::instance().find("int8_matmul_ste");
  ASSERT_NE(def, nullptr);
  for (const GradcheckSample& s : def->gradcheck_samples()) {
    GradcheckResult r = gradcheck(*def, s);
    EXPECT_TRUE(r.passed) << s.label << ": " << r.error << " max rel error " << r.max_rel_error;
    EXPECT_EQ(r.method, "reference-rule");
  }
}

TEST(Int8Matmul, BadInputsAreNamedErrors) {
  Operands o = random_operands(3, 2, 64, 32, 7, 5);
  auto call = [](std::vector<Tensor> in, const Attrs& a) {
    return run_op(Device::cpu(), "int8_matmul", in, a);
  };
  expect_error(
      [&] {
        call({o.a.cast(DType::f32), o.a_scale, o.a_zero, o.w, o.w_scale}, group(32));
      },
      {"int8_matmul", "a (activation codes) must be i8", "f32"});
  expect_error(
      [&] {
        call({o.a, o.a_scale, o.a_zero, i8({2, 32}, std::vector<int>(64, 1)), o.w_scale},
             group(32));
      },
      {"int8_matmul", "K differs", "[3, 64]", "[2, 32]"});
  expect_error(
      [&] {
        call({o.a, o.a_scale, o.a_zero, o.w, o.w_scale}, group(48));
      },
      {"int8_matmul", "'group_size' = 48", "does not divide K = 64"});
  expect_error(
      [&] {
        call({o.a, o.a_scale, o.a_zero, o.w, o.w_scale}, group(0));
      },
      {"int8_matmul", "w_scale must be [N, K / group] = [2, 1]", "[2, 2]"});
  expect_error(
      [&] {
        call({o.a, o.a_scale.cast(DType::f64), o.a_zero, o.w, o.w_scale}, group(32));
      },
      {"int8_matmul", "a_scale must be f32", "f64"});
  expect_error(
      [&] {
        call({o.a, f32({2}, {1, 1}), o.a_zero, o.w, o.w_scale}, group(32));
      },
      {"int8_matmul", "a_scale and a_zero must be [M] = [3]"});
  Tensor bad_zero = o.a_zero.clone();
  bad_zero.data<int32_t>()[1] = 200;
  expect_error(
      [&] {
        call({o.a, o.a_scale, bad_zero, o.w, o.w_scale}, group(32));
      },
      {"int8_matmul", "a_zero[1] = 200", "[-128, 127]"});
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    0.0f, -0.5f}) {
    Tensor s = o.w_scale.clone();
    s.data<float>()[3] = bad;
    expect_error(
        [&] {
          call({o.a, o.a_scale, o.a_zero, o.w, s}, group(32));
        },
        {"int8_matmul", "[3]"});
  }
  expect_error(
      [&] {
        call({Tensor::from_vector<int8_t>({0, 64}, {}), f32({0}, {}), i32({0}, {}), o.w, o.w_scale},
             group(32));
      },
      {"int8_matmul", "empty GEMM"});
  // A group too wide for an exact int32 sum, refused when the node is built (no data needed).
  Graph g;
  std::vector<ValueId> in = {g.input("a", {DType::i8, {1, 131072}}),
                             g.input("sa", {DType::f32, {1}}), g.input("za", {DType::i32, {1}}),
                             g.input("w", {DType::i8, {1, 131072}}),
                             g.input("sw", {DType::f32, {1}})};
  expect_error([&] { g.apply("int8_matmul", in, group(0)); },
               {"int8_matmul", "131072", "overflow the exact int32 sum", "65536"});
  expect_error(
      [&] {
        Graph h;
        std::vector<ValueId> ins = {h.input("x", {DType::f32, {3, 32}}),
                                    h.input("w", {DType::f32, {2, 64}})};
        for (const Tensor* t : {&o.a, &o.a_scale, &o.a_zero, &o.w, &o.w_scale})
          ins.push_back(h.input("c" + std::to_string(ins.size()), {t->dtype(), t->shape()}));
        h.apply("int8_matmul_ste", ins, {{"group_size", 32}});
      },
      {"int8_matmul_ste", "x and w_fq must have the codes' shapes [3, 64] and [2, 64]", "[3, 32]"});
}

TEST(Int8Matmul, GpuMatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  struct Case {
    int64_t m, n, k, g;
    int wmax;
  };
  // Ragged edges around the tiles, every recipe group and per channel, and two Llama-sized
  // projections (the 207M model's q and down projections at 2 x 1024 tokens).
  const std::vector<Case> cases = {
      {1, 1, 32, 32, 7},         {7, 5, 64, 32, 7},          {129, 130, 96, 32, 127},
      {300, 40, 512, 256, 7},    {65, 257, 256, 128, 7},     {33, 17, 2816, 0, 127},
      {2048, 1024, 1024, 32, 7}, {2048, 1024, 2816, 0, 127}, {2048, 1024, 2816, 64, 7}};
  uint32_t seed = 11;
  for (const Case& c : cases)
    for (const std::string& out : {"f32", "bf16", "f16", "f64"}) {
      SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                   " g" + std::to_string(c.g) + " " + out);
      Operands o = random_operands(c.m, c.n, c.k, c.g, c.wmax, seed++);
      std::vector<Tensor> in = {o.a, o.a_scale, o.a_zero, o.w, o.w_scale};
      auto cpu = run_op(Device::cpu(), "int8_matmul", in, group(c.g, out));
      auto gpu = run_op(Device::cuda(), "int8_matmul", in, group(c.g, out));
      EXPECT_TRUE(same_bits(cpu[0], gpu[0]));
    }
}

TEST(Int8Matmul, GpuRefusesGroupsOffTheTensorCoreStep) {
  QG_REQUIRE_GPU();
  Operands o = random_operands(4, 4, 48, 16, 7, 9);
  expect_error(
      [&] {
        run_op(Device::cuda(), "int8_matmul", {o.a, o.a_scale, o.a_zero, o.w, o.w_scale},
               group(16));
      },
      {"int8_matmul", "multiple of 32", "16"});
}

}  // namespace
}  // namespace qg
