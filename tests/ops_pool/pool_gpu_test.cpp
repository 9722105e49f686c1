// The CUDA pooling kernels against the CPU reference, bit for bit (outputs, indices and
// gradients: both backends visit windows and sum overlaps in the same order). Skips
// without a GPU.
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::run_op;
using testing::same_bits;

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& e : v) e = dist(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

struct PoolCase {
  Shape shape;
  Attrs attrs;
};

std::vector<PoolCase> max_cases() {
  return {{{2, 3, 9, 11}, {{"kernel", {2, 2}}}},
          {{1, 4, 10, 7},
           {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}}},
          {{2, 2, 12, 13},
           {{"kernel", {3, 2}}, {"stride", {1, 2}}, {"padding", {1, 1}}, {"dilation", {2, 3}}}},
          {{1, 1, 33, 40}, {{"kernel", {5, 5}}, {"stride", {1, 1}}, {"padding", {2, 2}}}},
          // Windows with no input cell (-inf, an index outside the window, no gradient).
          {{1, 2, 5, 1},
           {{"kernel", {1, 2}}, {"stride", {1, 1}}, {"padding", {0, 1}}, {"dilation", {1, 2}}}}};
}

std::vector<PoolCase> avg_cases() {
  return {{{2, 3, 9, 11}, {{"kernel", {2, 2}}}},
          {{1, 4, 10, 7},
           {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}}},
          {{1, 4, 10, 7},
           {{"kernel", {3, 3}},
            {"stride", {2, 2}},
            {"padding", {1, 1}},
            {"ceil_mode", true},
            {"count_include_pad", false}}},
          {{1, 1, 33, 40}, {{"kernel", {5, 4}}, {"stride", {1, 1}}, {"padding", {2, 1}}}}};
}

TEST(PoolGpu, MaxPoolForwardAndBackwardMatchCpuBitForBit) {
  QG_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const PoolCase& c : max_cases()) {
      Tensor x = random_tensor(c.shape, dtype, seed++);
      auto cpu = run_op(Device::cpu(), "max_pool2d", {x}, c.attrs);
      auto gpu = run_op(Device::cuda(), "max_pool2d", {x}, c.attrs);
      EXPECT_TRUE(same_bits(cpu[0], gpu[0])) << shape_str(c.shape);
      EXPECT_TRUE(same_bits(cpu[1], gpu[1])) << shape_str(c.shape);
      Attrs back = c.attrs;
      back.set("input_shape", c.shape);
      Tensor dy = random_tensor(cpu[0].shape(), dtype, seed++);
      auto dcpu = run_op(Device::cpu(), "max_pool2d_backward", {dy, cpu[1]}, back);
      auto dgpu = run_op(Device::cuda(), "max_pool2d_backward", {dy, cpu[1]}, back);
      EXPECT_TRUE(same_bits(dcpu[0], dgpu[0])) << shape_str(c.shape);
    }
}

TEST(PoolGpu, AvgPoolForwardAndBackwardMatchCpuBitForBit) {
  QG_REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const PoolCase& c : avg_cases()) {
      Tensor x = random_tensor(c.shape, dtype, seed++);
      auto cpu = run_op(Device::cpu(), "avg_pool2d", {x}, c.attrs);
      auto gpu = run_op(Device::cuda(), "avg_pool2d", {x}, c.attrs);
      EXPECT_TRUE(same_bits(cpu[0], gpu[0])) << shape_str(c.shape);
      Attrs back = c.attrs;
      back.set("input_shape", c.shape);
      Tensor dy = random_tensor(cpu[0].shape(), dtype, seed++);
      auto dcpu = run_op(Device::cpu(), "avg_pool2d_backward", {dy}, back);
      auto dgpu = run_op(Device::cuda(), "avg_pool2d_backward", {dy}, back);
      EXPECT_TRUE(same_bits(dcpu[0], dgpu[0])) << shape_str(c.shape);
    }
}

TEST(PoolGpu, MaxPoolNaNMatchesCpu) {
  QG_REQUIRE_GPU();
  Tensor x = Tensor::from_doubles({1, 1, 2, 4}, {1, NAN, 3, 4, NAN, 2, 7, 0}, DType::f32);
  Attrs a = {{"kernel", {2, 2}}};
  auto cpu = run_op(Device::cpu(), "max_pool2d", {x}, a);
  auto gpu = run_op(Device::cuda(), "max_pool2d", {x}, a);
  EXPECT_TRUE(same_bits(cpu[1], gpu[1]));
  EXPECT_EQ(gpu[1].to_doubles(), (std::vector<double>{4, 6}));
}

TEST(PoolGpu, GlobalAvgPoolMatchesCpuBitForBit) {
  QG_REQUIRE_GPU();
  uint64_t seed = 200;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const Shape& shape : std::vector<Shape>{{2, 3, 7, 7}, {4, 64, 1, 1}, {1, 5, 30, 31}}) {
      Tensor x = random_tensor(shape, dtype, seed++);
      auto cpu = run_op(Device::cpu(), "global_avg_pool2d", {x});
      auto gpu = run_op(Device::cuda(), "global_avg_pool2d", {x});
      EXPECT_TRUE(same_bits(cpu[0], gpu[0])) << shape_str(shape);
      Tensor dy = random_tensor({shape[0], shape[1]}, dtype, seed++);
      Attrs back = {{"input_shape", shape}};
      auto dcpu = run_op(Device::cpu(), "global_avg_pool2d_backward", {dy}, back);
      auto dgpu = run_op(Device::cuda(), "global_avg_pool2d_backward", {dy}, back);
      EXPECT_TRUE(same_bits(dcpu[0], dgpu[0])) << shape_str(shape);
    }
}

}  // namespace
}  // namespace qg
