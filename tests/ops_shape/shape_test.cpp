// permute and transpose: reorderings checked by hand, the collapsed gather plan, bad
// attributes, and the CUDA gather against the CPU bit for bit for every element size.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "ops/shape/permute_plan.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

// x[i] = i, so every output value names the input element it came from.
Tensor iota(const Shape& s, DType d = DType::f32) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  std::iota(v.begin(), v.end(), 0.0);
  return Tensor::from_doubles(s, v, d);
}

TEST(Permute, MatrixTransposeByHand) {
  // [[0, 1, 2], [3, 4, 5]] -> [[0, 3], [1, 4], [2, 5]].
  Tensor y = run_op(Device::cpu(), "permute", {iota({2, 3})}, {{"perm", Shape{1, 0}}})[0];
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Permute, Rank3ByHand) {
  // x [2, 3, 2], x[a, b, c] = 6a + 2b + c; perm (2, 0, 1): y[c, a, b] = x[a, b, c].
  Tensor y = run_op(Device::cpu(), "permute", {iota({2, 3, 2})}, {{"perm", Shape{2, 0, 1}}})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  std::vector<double> want;
  for (int c = 0; c < 2; ++c)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b) want.push_back(6 * a + 2 * b + c);
  EXPECT_EQ(y.to_doubles(), want);
  // Negative entries count from the end: (-1, 0, 1) is the same permutation.
  EXPECT_TRUE(same_bits(
      y, run_op(Device::cpu(), "permute", {iota({2, 3, 2})}, {{"perm", Shape{-1, 0, 1}}})[0]));
}

TEST(Permute, IntegerAndIdentity) {
  Tensor x = Tensor::from_vector<int64_t>({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(run_op(Device::cpu(), "permute", {x}, {{"perm", Shape{1, 0}}})[0].to_doubles(),
            (std::vector<double>{1, 3, 2, 4}));
  EXPECT_TRUE(same_bits(x, run_op(Device::cpu(), "permute", {x}, {{"perm", Shape{0, 1}}})[0]));
}

TEST(Permute, PlanMergesContiguousAxesAndDropsOnes) {
  // [2, 3, 4, 5] with perm (2, 3, 0, 1) is a [6, 20] -> [20, 6] transpose.
  PermutePlan p = make_permute_plan({2, 3, 4, 5}, {2, 3, 0, 1});
  EXPECT_EQ(p.sizes, (std::vector<int64_t>{20, 6}));
  EXPECT_EQ(p.src_strides, (std::vector<int64_t>{1, 20}));
  // A batched last-two-axes swap: the batch axes merge into one (the tiled CUDA layout).
  PermutePlan t = make_permute_plan({3, 2, 70, 20}, {0, 1, 3, 2});
  EXPECT_EQ(t.sizes, (std::vector<int64_t>{6, 20, 70}));
  EXPECT_EQ(t.src_strides, (std::vector<int64_t>{1400, 1, 20}));
  // Size-1 axes vanish; the identity is one run.
  EXPECT_EQ(make_permute_plan({1, 4, 1, 3}, {2, 1, 0, 3}).sizes, (std::vector<int64_t>{12}));
}

TEST(Transpose, SwapsTwoAxes) {
  // x [2, 3, 2]; transpose(0, -1): y[c, b, a] = x[a, b, c].
  Tensor y = run_op(Device::cpu(), "transpose", {iota({2, 3, 2})}, {{"dim0", 0}, {"dim1", -1}})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  std::vector<double> want;
  for (int c = 0; c < 2; ++c)
    for (int b = 0; b < 3; ++b)
      for (int a = 0; a < 2; ++a) want.push_back(6 * a + 2 * b + c);
  EXPECT_EQ(y.to_doubles(), want);
}

TEST(ShapeErrors, PermNotAPermutation) {
  expect_error(
      [] {
        run_op(Device::cpu(), "permute", {iota({2, 3, 4})}, {{"perm", Shape{0, 0, 1}}});
      },
      {"[permute]", "'perm' = [0, 0, 1]", "not a permutation of 0..2"});
  expect_error(
      [] {
        run_op(Device::cpu(), "permute", {iota({2, 3, 4})}, {{"perm", Shape{0, 1, 3}}});
      },
      {"[permute]", "'perm' = [0, 1, 3]", "not a permutation"});
}

TEST(ShapeErrors, PermWrongLength) {
  expect_error(
      [] {
        run_op(Device::cpu(), "permute", {iota({2, 3, 4})}, {{"perm", Shape{1, 0}}});
      },
      {"[permute]", "'perm' = [1, 0]", "2 entries", "rank 3"});
}

TEST(ShapeErrors, TransposeDimOutOfRange) {
  expect_error(
      [] {
        run_op(Device::cpu(), "transpose", {iota({2, 3})}, {{"dim0", 0}, {"dim1", 2}});
      },
      {"[transpose]", "'dim1' = 2", "rank 2"});
  expect_error(
      [] {
        run_op(Device::cpu(), "transpose", {iota({2, 3})}, {{"dim0", -3}, {"dim1", 0}});
      },
      {"[transpose]", "'dim0' = -3"});
}

// ---- GPU against the CPU reference ------------------------------------------------------

TEST(ShapeGpu, BitExactForEveryElementSize) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape shape;
    Shape perm;
  };
  // The first three are (batched) last-two-axes swaps, which take the tiled kernel.
  const std::vector<Case> cases = {
      {{33, 65}, {1, 0}},
      {{4, 40, 50}, {0, 2, 1}},
      {{3, 2, 70, 20}, {0, 1, 3, 2}},
      {{2, 3, 4, 5}, {2, 0, 3, 1}},
      {{3, 1, 4, 2, 5, 3}, {5, 4, 3, 2, 1, 0}},
      {{2, 3, 2, 3, 2, 3, 2}, {4, 5, 6, 0, 1, 2, 3}},  // rank 7, merges to 2
      // The innermost axis stays: whole runs move as 16-byte units where the run is a
      // multiple of 16 bytes for the dtype (attention's head split), else element by element.
      {{2, 5, 3, 64}, {0, 2, 1, 3}},
      {{3, 4, 2, 16}, {2, 0, 1, 3}},
      {{2, 5, 3, 6}, {0, 2, 1, 3}},
      // Larger ones: several grid steps of four elements per thread, odd sizes that leave a
      // partial step, and attention's head split at a bigger scale.
      {{37, 129, 5}, {2, 0, 1}},
      {{4, 64, 12, 64}, {0, 2, 1, 3}},
      {{0, 4}, {1, 0}},
      {{}, {}}};
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 100);
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i8, DType::i32,
                  DType::i64, DType::u8}) {
    for (const Case& c : cases) {
      std::vector<double> v(static_cast<size_t>(shape_numel(c.shape)));
      for (double& e : v) e = u(rng);
      Tensor x = Tensor::from_doubles(c.shape, v, d);
      Attrs a{{"perm", c.perm}};
      std::string what = std::string(dtype_name(d)) + shape_str(c.shape) + shape_str(c.perm);
      EXPECT_TRUE(same_bits(run_op(Device::cpu(), "permute", {x}, a)[0],
                            run_op(Device::cuda(), "permute", {x}, a)[0]))
          << what;
    }
    Tensor x = Tensor::from_doubles({4, 5, 6}, std::vector<double>(120, 1.5), d);
    Attrs t{{"dim0", -1}, {"dim1", 0}};
    EXPECT_TRUE(same_bits(run_op(Device::cpu(), "transpose", {x}, t)[0],
                          run_op(Device::cuda(), "transpose", {x}, t)[0]));
  }
}

}  // namespace
}  // namespace qg
