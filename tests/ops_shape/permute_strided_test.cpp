// permute and transpose on strided views, called directly (runtime/op_call.h): slices, steps,
// permuted and broadcast (stride 0) views give the bits of the same op on a contiguous copy,
// on the CPU and on the GPU (through the element gather, the 16-byte unit gather and the
// batched-transpose plan), for every element size. The output is contiguous.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "runtime/op_call.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::same_bits;

Tensor iota(const Shape& s, DType d = DType::f32) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  std::iota(v.begin(), v.end(), 0.0);
  return Tensor::from_doubles(s, v, d);
}

Tensor contiguous_copy(const Tensor& t) {
  return Tensor::from_doubles(t.shape(), t.to_doubles(), t.dtype());
}

TEST(PermuteStrided, SliceByHand) {
  auto cpu = make_device_context(Device::cpu());
  // x [4, 6, 5], x[a, b, c] = 30a + 5b + c; the view x[:, 1:4, ::2] is [4, 3, 3].
  Tensor view = iota({4, 6, 5}).as_strided({4, 3, 3}, {30, 5, 2}, 5);
  ASSERT_FALSE(view.is_contiguous());
  // perm (2, 0, 1): y[c, a, b] = view[a, b, c] = x[a, 1 + b, 2c].
  Tensor y = call_op(*cpu, "permute", {view}, {{"perm", Shape{2, 0, 1}}})[0];
  EXPECT_EQ(y.shape(), (Shape{3, 4, 3}));
  EXPECT_TRUE(y.is_contiguous());
  std::vector<double> want;
  for (int c = 0; c < 3; ++c)
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 3; ++b) want.push_back(30 * a + 5 * (1 + b) + 2 * c);
  EXPECT_EQ(y.to_doubles(), want);
  // Transposing a transposed view gives x back.
  Tensor xt = iota({2, 3}).as_strided({3, 2}, {1, 3});
  EXPECT_EQ(call_op(*cpu, "transpose", {xt}, {{"dim0", 0}, {"dim1", 1}})[0].to_doubles(),
            (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

struct ViewCase {
  std::string label;
  Shape buffer, shape, strides;
  int64_t offset;
  Shape perm;
};

const std::vector<ViewCase>& view_cases() {
  static const std::vector<ViewCase> c = {
      {"slice x[:, 1:4, ::2]", {4, 6, 5}, {4, 3, 3}, {30, 5, 2}, 5, {2, 0, 1}},
      // [B, T, H, hd] seen as [B, H, T, hd], heads moved outermost: whole rows move (the
      // 16-byte unit gather), as do the runs of 4 of 8 elements for 4- and 8-byte elements.
      {"heads view", {2, 5, 3, 64}, {2, 3, 5, 64}, {960, 64, 192, 1}, 0, {1, 0, 2, 3}},
      {"runs of 4 of 8", {4, 6, 8}, {4, 6, 4}, {48, 8, 1}, 0, {1, 0, 2}},
      {"broadcast batch", {3, 4}, {2, 3, 4}, {0, 4, 1}, 0, {2, 1, 0}},
      // Every other matrix of [6, 40, 50], transposed: not the batched-transpose layout.
      {"x[::2] transposed", {6, 40, 50}, {3, 40, 50}, {4000, 50, 1}, 0, {0, 2, 1}},
      // A transposed view of [3, 40, 50] copied as it stands: the plan is a batched transpose
      // of contiguous [40, 50] matrices (the tiled CUDA kernel).
      {"transposed view", {3, 40, 50}, {3, 50, 40}, {2000, 1, 50}, 0, {0, 1, 2}},
      {"column x[:, 2]", {7, 5}, {7}, {5}, 2, {0}},
  };
  return c;
}

const std::vector<DType>& element_sizes() {
  static const std::vector<DType> d = {DType::u8,  DType::f16, DType::bf16,
                                       DType::f32, DType::f64, DType::i64};
  return d;
}

// The op on the view (on `device`) against the op on a contiguous copy on the CPU.
void expect_views_match_copies(Device device) {
  auto ctx = make_device_context(device);
  auto cpu = make_device_context(Device::cpu());
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 100);
  for (DType d : element_sizes())
    for (const ViewCase& c : view_cases()) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " " + c.label);
      std::vector<double> v(static_cast<size_t>(shape_numel(c.buffer)));
      for (double& e : v) e = u(rng);
      const Tensor host = Tensor::from_doubles(c.buffer, v, d);
      const Tensor copy = contiguous_copy(host.as_strided(c.shape, c.strides, c.offset));
      const Tensor view = host.to(device).as_strided(c.shape, c.strides, c.offset);
      const Attrs perm{{"perm", c.perm}};
      const Tensor want = call_op(*cpu, "permute", {copy}, perm)[0];
      EXPECT_TRUE(same_bits(call_op(*ctx, "permute", {view}, perm)[0].to(Device::cpu()), want));
      if (c.perm.size() >= 2) {
        const Attrs swap{{"dim0", 0}, {"dim1", -1}};
        EXPECT_TRUE(same_bits(call_op(*ctx, "transpose", {view}, swap)[0].to(Device::cpu()),
                              call_op(*cpu, "transpose", {copy}, swap)[0]));
      }
    }
}

TEST(PermuteStrided, ViewsMatchContiguousCopiesOnCpu) {
  expect_views_match_copies(Device::cpu());
}

TEST(PermuteStrided, ViewsMatchContiguousCopiesOnGpu) {
  QG_REQUIRE_GPU();
  expect_views_match_copies(Device::cuda());
}

// Seven axes whose strides (powers of 3 over [2]^7) never merge: the CPU gathers them, the
// CUDA gather takes at most six and says so.
TEST(PermuteStrided, UnmergeableRank7View) {
  const Shape shape(7, 2), strides = {729, 243, 81, 27, 9, 3, 1};
  const Tensor host = iota({2187}).as_strided(shape, strides);
  const Attrs identity{{"perm", Shape{0, 1, 2, 3, 4, 5, 6}}};
  auto cpu = make_device_context(Device::cpu());
  EXPECT_EQ(call_op(*cpu, "permute", {host}, identity)[0].to_doubles(), host.to_doubles());
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present: the GPU half skipped";
  auto gpu = make_device_context(Device::cuda());
  const Tensor view = iota({2187}).to(Device::cuda()).as_strided(shape, strides);
  expect_error([&] { call_op(*gpu, "permute", {view}, identity); },
               {"permute", "at most 6 dimensions", "needs 7"});
}

}  // namespace
}  // namespace qg
