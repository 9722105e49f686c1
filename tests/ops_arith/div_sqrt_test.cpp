// div and sqrt (added for the conv-bn fold's running_std = sqrt(var + eps) and
// scale_factor = gamma / running_std): hand-checked values with broadcasting, IEEE special
// cases (x / 0, sqrt of a negative), the gradients through grad() against their closed
// forms, bad inputs, and the GPU against the CPU bit for bit (correctly rounded division and
// square root on both, no fast-math; NaN payloads differ, so NaN only has to match NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

TEST(Div, BroadcastsAndFollowsIeee) {
  Tensor a = Tensor::from_doubles({2, 3}, {1, -6, 9, 0, 5, -1}, DType::f32);
  Tensor b = Tensor::from_doubles({3}, {2, 3, 0}, DType::f32);
  auto y = run_op(Device::cpu(), "div", {a, b})[0].to_doubles();
  EXPECT_EQ(y[0], 0.5);
  EXPECT_EQ(y[1], -2.0);
  EXPECT_TRUE(std::isinf(y[2]) && y[2] > 0);  // 9 / 0 = +inf, as torch gives
  EXPECT_EQ(y[3], 0.0);
  EXPECT_FLOAT_EQ(y[4], 5.0f / 3.0f);
  EXPECT_TRUE(std::isinf(y[5]) && y[5] < 0);
}

TEST(Sqrt, ValuesAndNegativeInput) {
  Tensor x = Tensor::from_doubles({4}, {4, 2, 0, -1}, DType::f32);
  auto y = run_op(Device::cpu(), "sqrt", {x})[0].to_doubles();
  EXPECT_EQ(y[0], 2.0);
  EXPECT_FLOAT_EQ(y[1], std::sqrt(2.0f));
  EXPECT_EQ(y[2], 0.0);
  EXPECT_TRUE(std::isnan(y[3]));
}

TEST(DivSqrt, GradientsMatchTheirClosedForms) {
  // loss = sum(a / b) with b [2] broadcast over a [3, 2]: da = 1 / b,
  // db_j = -sum_i a_ij / b_j^2; loss2 = sum(sqrt(x)): dx = 1 / (2 sqrt(x)).
  Graph g;
  ValueId a = g.input("a", {DType::f64, {3, 2}});
  ValueId b = g.input("b", {DType::f64, {2}});
  ValueId x = g.input("x", {DType::f64, {3}});
  ValueId loss = g.apply1("add", {g.apply1("sum", {g.apply1("div", {a, b})}),
                                  g.apply1("sum", {g.apply1("sqrt", {x})})});
  auto grads = grad(g, loss, {a, b, x});
  Executor ex(g);
  auto out = ex.run({{"a", Tensor::from_doubles({3, 2}, {1, 2, 3, 4, 5, 6}, DType::f64)},
                     {"b", Tensor::from_doubles({2}, {2, -4}, DType::f64)},
                     {"x", Tensor::from_doubles({3}, {1, 4, 9}, DType::f64)}},
                    grads);
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{0.5, -0.25, 0.5, -0.25, 0.5, -0.25}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{-9.0 / 4, -12.0 / 16}));
  EXPECT_EQ(out[2].to_doubles(), (std::vector<double>{0.5, 0.25, 1.0 / 6}));
}

TEST(DivSqrt, BadInputs) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2, 3}});
  ValueId b = g.input("b", {DType::f32, {4}});
  ValueId i = g.input("i", {DType::i32, {3}});
  expect_error([&] { g.apply("div", {a, b}); }, {"div", "[2, 3]", "[4]"});
  expect_error([&] { g.apply("sqrt", {i}); }, {"sqrt", "i32"});
}

// Bit-identical, except that a NaN only has to meet a NaN (x86 and CUDA write different NaN
// payloads for 0 / 0 and sqrt(-1), as the crosscheck's rule allows).
void expect_same_bits_or_both_nan(const Tensor& cpu, const Tensor& gpu) {
  ASSERT_EQ(cpu.numel(), gpu.numel());
  const float* a = cpu.data<float>();
  const float* b = gpu.to(Device::cpu()).data<float>();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    bool same = std::isnan(a[i]) ? std::isnan(b[i]) : std::memcmp(&a[i], &b[i], 4) == 0;
    mismatches += same ? 0 : 1;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DivSqrtGpu, BitIdenticalToTheCpu) {
  QG_REQUIRE_GPU();
  std::vector<double> av, bv;
  for (int k = 0; k < 4096; ++k) {
    av.push_back(std::sin(k * 0.37) * 1e3);
    bv.push_back(k % 64 == 0 ? 0.0 : std::cos(k * 0.11) * 7.0);
  }
  Tensor a = Tensor::from_doubles({64, 64}, av, DType::f32);
  Tensor b = Tensor::from_doubles({64, 64}, bv, DType::f32);
  Tensor col =
      Tensor::from_doubles({64, 1}, std::vector<double>(bv.begin(), bv.begin() + 64), DType::f32);
  for (auto args : {std::vector<Tensor>{a, b}, std::vector<Tensor>{a, col}})
    expect_same_bits_or_both_nan(run_op(Device::cpu(), "div", args)[0],
                                 run_op(Device::cuda(), "div", args)[0]);
  expect_same_bits_or_both_nan(run_op(Device::cpu(), "sqrt", {a})[0],
                               run_op(Device::cuda(), "sqrt", {a})[0]);
}

}  // namespace
}  // namespace qg
