// add / sub / mul / div with one operand broadcast along leading axes only (a scalar, a bias
// row, a trailing block: the 32-bit suffix path of ops/arith/arith_cuda.cu) and with other
// broadcasts (the general index-mapping path), against the CPU bit for bit in every float
// dtype, with the broadcast operand first or second, packed (16-byte aligned, suffix a
// multiple of the pack) and not. Data includes NaN, infinities and signed zeros.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gpu_test_util.h"
#include "tests/common/tensor_compare.h"

namespace qg {
namespace {

using testing::first_difference;
using testing::NanRule;

using testing::run_op;
using testing::same_bits;

Tensor data(const Shape& shape, DType dtype, uint64_t seed) {
  const double inf = std::numeric_limits<double>::infinity();
  const double edges[] = {std::nan(""), inf, -inf, 0.0, -0.0, 1e-3};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-3, 3);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 37 == 3 ? edges[(i / 37) % 6] : dist(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

struct BroadcastCase {
  Shape full, small;
};

TEST(ArithBroadcastGpu, MatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  const std::vector<BroadcastCase> cases = {
      {{7, 33}, {33}},           // bias row, odd length: scalar loop
      {{64, 768}, {768}},        // bias row, packed
      {{8, 12, 16, 16}, {1}},    // scalar (attention's score scale)
      {{8, 12, 16, 16}, {}},     // rank-0 scalar
      {{4, 8, 16}, {8, 16}},     // trailing block
      {{4, 8, 16}, {1, 1, 16}},  // leading 1s
      {{3, 1001}, {1001}},       // tail after whole packs
      {{6, 5, 4}, {5, 1}},       // not a suffix: general path
      {{6, 5, 4}, {6, 1, 1}},    // channel-style: general path
  };
  for (const char* op : {"add", "sub", "mul", "div"})
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
      for (const auto& c : cases)
        for (bool small_first : {false, true}) {
          Tensor full = data(c.full, t, 1), small = data(c.small, t, 2);
          std::vector<Tensor> in =
              small_first ? std::vector<Tensor>{small, full} : std::vector<Tensor>{full, small};
          auto cpu = run_op(Device::cpu(), op, in);
          auto gpu = run_op(Device::cuda(), op, in);
          ASSERT_EQ(cpu[0].shape(), gpu[0].shape());
          EXPECT_EQ(first_difference(cpu[0], gpu[0], NanRule::any_payload), "")
              << op << " " << dtype_name(t) << " " << shape_str(c.full) << " with "
              << shape_str(c.small) << (small_first ? " (broadcast operand first)" : "");
        }
}

// sum_to down to trailing axes (bias gradients): the coalesced column-sum path of
// launch_reduce. Identical bits run to run, and within the bounds below of the CPU, which
// sums in another order.
TEST(ArithBroadcastGpu, ColumnSumsAreDeterministicAndMatchTheCpu) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape x, y;
  };
  const std::vector<Case> cases = {{{4096, 768}, {768}},    {{8, 512, 768}, {1, 768}},
                                   {{3000, 33}, {33}},      {{5, 7, 40}, {7, 40}},
                                   {{2, 100003}, {100003}}, {{4096, 31}, {31}}};
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (const auto& c : cases) {
      Tensor x = data(c.x, t, 3);
      // No NaN or infinity here: the comparison below is of finite sums.
      std::vector<double> v = x.to_doubles();
      for (double& e : v)
        if (!std::isfinite(e)) e = 1.5;
      x = Tensor::from_doubles(c.x, v, t);
      const Attrs a{{"shape", c.y}};
      auto g1 = run_op(Device::cuda(), "sum_to", {x}, a);
      auto g2 = run_op(Device::cuda(), "sum_to", {x}, a);
      auto cpu = run_op(Device::cpu(), "sum_to", {x}, a);
      EXPECT_TRUE(same_bits(g1[0], g2[0])) << dtype_name(t) << " " << shape_str(c.x);
      // f32/f16/bf16: both sum in f64 and round once, so at most one unit in the last place
      // of the result. f64: every add rounds in f64, so the two orders may differ by the
      // classic bound rows * eps * sum |x| (4096 rows: about 1e-12 of sum |x|).
      const double ulp = t == DType::f32 ? 0x1p-23 : t == DType::bf16 ? 0x1p-7 : 0x1p-10;
      const auto gv = g1[0].to_doubles(), cv = cpu[0].to_doubles(), xv = x.to_doubles();
      const int64_t cols = shape_numel(c.y), rows = x.numel() / cols;
      for (int64_t i = 0; i < cols; ++i) {
        double abs_sum = 0;
        for (int64_t r = 0; r < rows; ++r) abs_sum += std::abs(xv[r * cols + i]);
        const double bound = t == DType::f64 ? static_cast<double>(rows) * 0x1p-52 * abs_sum
                                             : ulp * std::abs(cv[i]) + 1e-300;
        ASSERT_LE(std::abs(gv[i] - cv[i]), bound)
            << dtype_name(t) << " " << shape_str(c.x) << " column " << i << ": gpu " << gv[i]
            << ", cpu " << cv[i];
      }
    }
}

}  // namespace
}  // namespace qg
