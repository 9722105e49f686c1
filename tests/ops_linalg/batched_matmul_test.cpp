// batched_matmul: products worked out by hand (every transpose flag, two batch axes), its
// backward rule against per-batch matmul, bad shapes and dtypes, and cuBLAS against Eigen.
#include <gtest/gtest.h>

#include <random>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

Tensor f64(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::f64);
}

TEST(BatchedMatmul, TwoBatchesByHand) {
  // Batch 0: [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]].
  // Batch 1: [[1, 0], [0, 2]] @ [[1, 1], [1, -1]] = [[1, 1], [2, -2]].
  Tensor a = f64({2, 2, 2}, {1, 2, 3, 4, 1, 0, 0, 2});
  Tensor b = f64({2, 2, 2}, {5, 6, 7, 8, 1, 1, 1, -1});
  Tensor y = run_op(Device::cpu(), "batched_matmul", {a, b})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{19, 22, 43, 50, 1, 1, 2, -2}));
}

TEST(BatchedMatmul, TransposeFlagsByHand) {
  // a = [[1, 2, 3]] (1 x 3), b = [[1], [0], [2]] (3 x 1): a @ b = [[7]].
  // Stored transposed, a^T is [3, 1] and b^T is [1, 3]; every flag combination gives 7.
  Tensor a = f64({1, 1, 3}, {1, 2, 3}), at = f64({1, 3, 1}, {1, 2, 3});
  Tensor b = f64({1, 3, 1}, {1, 0, 2}), bt = f64({1, 1, 3}, {1, 0, 2});
  auto run = [](const Tensor& x, const Tensor& w, bool ta, bool tb) {
    return run_op(Device::cpu(), "batched_matmul", {x, w},
                  {{"transpose_a", ta}, {"transpose_b", tb}})[0]
        .to_doubles();
  };
  EXPECT_EQ(run(a, b, false, false), std::vector<double>{7});
  EXPECT_EQ(run(at, b, true, false), std::vector<double>{7});
  EXPECT_EQ(run(a, bt, false, true), std::vector<double>{7});
  EXPECT_EQ(run(at, bt, true, true), std::vector<double>{7});
  // The outer product the other way round: b @ a is 3 x 3 = [[1, 2, 3], [0, 0, 0], [2, 4, 6]].
  EXPECT_EQ(run(b, a, false, false), (std::vector<double>{1, 2, 3, 0, 0, 0, 2, 4, 6}));
  EXPECT_EQ(run(bt, at, true, true), (std::vector<double>{1, 2, 3, 0, 0, 0, 2, 4, 6}));
}

TEST(BatchedMatmul, TwoBatchAxesMatchPerBatchMatmul) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> av(2 * 3 * 4 * 5), bv(2 * 3 * 5 * 2);
  for (double& v : av) v = u(rng);
  for (double& v : bv) v = u(rng);
  Tensor y =
      run_op(Device::cpu(), "batched_matmul", {f64({2, 3, 4, 5}, av), f64({2, 3, 5, 2}, bv)})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 2}));
  std::vector<double> got = y.to_doubles();
  for (int batch = 0; batch < 6; ++batch) {
    std::vector<double> sa(av.begin() + batch * 20, av.begin() + batch * 20 + 20);
    std::vector<double> sb(bv.begin() + batch * 10, bv.begin() + batch * 10 + 10);
    std::vector<double> want =
        run_op(Device::cpu(), "matmul", {f64({4, 5}, sa), f64({5, 2}, sb)})[0].to_doubles();
    for (int k = 0; k < 8; ++k) EXPECT_DOUBLE_EQ(got[batch * 8 + k], want[k]);
  }
}

TEST(BatchedMatmul, BackwardIsBatchedMatmul) {
  // d/da sum(y * w) = w @ b^T for y = a @ b; the rule must add batched_matmul nodes.
  Graph g;
  ValueId a = g.input("a", {DType::f64, {2, 2, 3}});
  ValueId b = g.input("b", {DType::f64, {2, 3, 1}});
  ValueId y = g.apply1("batched_matmul", {a, b});
  ValueId loss = g.apply1("sum", {y});
  std::vector<ValueId> grads = grad(g, loss, {a, b});
  Executor ex(g);
  Tensor av = f64({2, 2, 3}, {1, 2, 3, 4, 5, 6, 1, 1, 1, 0, 0, 0});
  Tensor bv = f64({2, 3, 1}, {1, 0, -1, 2, 3, 4});
  auto out = ex.run({{"a", av}, {"b", bv}}, grads);
  // da[batch, i, k] = b[batch, k]; db[batch, k] = sum_i a[batch, i, k].
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1, 0, -1, 1, 0, -1, 2, 3, 4, 2, 3, 4}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{5, 7, 9, 1, 1, 1}));
}

TEST(BatchedMatmulErrors, RankBelowThree) {
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({3, 4}, DType::f32)});
      },
      {"[batched_matmul]", "rank >= 3", "f32[2, 3]", "f32[3, 4]"});
}

TEST(BatchedMatmulErrors, BatchDimsDiffer) {
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::zeros({3, 4, 5}, DType::f32)});
      },
      {"[batched_matmul]", "batch dimensions differ", "[2, 3, 4]", "[3, 4, 5]"});
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::zeros({1, 2, 4, 5}, DType::f32)});
      },
      {"[batched_matmul]", "batch dimensions differ"});
}

TEST(BatchedMatmulErrors, InnerDimsDiffer) {
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::zeros({2, 5, 6}, DType::f32)});
      },
      {"[batched_matmul]", "inner dimensions differ", "[..., 3, 4]", "[..., 5, 6]"});
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::zeros({2, 4, 6}, DType::f32)},
               {{"transpose_a", true}});
      },
      {"[batched_matmul]", "inner dimensions differ", "transpose_a=1"});
}

TEST(BatchedMatmulErrors, DtypeMismatch) {
  expect_error(
      [] {
        run_op(Device::cpu(), "batched_matmul",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::zeros({2, 4, 5}, DType::f64)});
      },
      {"[batched_matmul]", "dtype mismatch", "f32[2, 3, 4]", "f64[2, 4, 5]"});
}

// ---- GPU against the CPU reference ------------------------------------------------------

TEST(BatchedMatmulGpu, MatchesEigen) {
  QG_REQUIRE_GPU();
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  auto random = [&](const Shape& s, DType d) {
    std::vector<double> v(static_cast<size_t>(shape_numel(s)));
    for (double& e : v) e = u(rng);
    return Tensor::from_doubles(s, v, d);
  };
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (int flags = 0; flags < 4; ++flags) {
      bool ta = flags & 1, tb = flags & 2;
      Shape as = ta ? Shape{3, 2, 65, 33} : Shape{3, 2, 33, 65};
      Shape bs = tb ? Shape{3, 2, 17, 65} : Shape{3, 2, 65, 17};
      Tensor a = random(as, d), b = random(bs, d);
      Attrs at{{"transpose_a", ta}, {"transpose_b", tb}};
      std::vector<double> c = run_op(Device::cpu(), "batched_matmul", {a, b}, at)[0].to_doubles();
      std::vector<double> g = run_op(Device::cuda(), "batched_matmul", {a, b}, at)[0].to_doubles();
      ASSERT_EQ(c.size(), g.size());
      double scale = 1e-30, worst = 0;
      for (double v : c) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - g[i]));
      double tol = d == DType::f64   ? 1e-12
                   : d == DType::f32 ? 1e-5
                   : d == DType::f16 ? 2e-3
                                     : 1.6e-2;
      EXPECT_LE(worst / scale, tol) << dtype_name(d) << " ta " << ta << " tb " << tb;
    }
  }
}

}  // namespace
}  // namespace qg
