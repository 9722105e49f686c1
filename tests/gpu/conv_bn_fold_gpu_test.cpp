// conv_bn_fold_weight and its backward (ops/fold/conv_bn_fold_cuda.cu) against the CPU bit
// for bit, f32 and f64: the CNN's [64, 64, 3, 3] weights, rows longer than the backward's
// shared-memory chunk (1024) and not a multiple of the block, one element per row, and data
// with NaN, infinities and signed zeros (NaN matches any NaN: x86 and CUDA produce different
// payloads). dgamma's f64 sum is added in the CPU's order on the GPU, so it is exact too.
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

Tensor data(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi, bool edges) {
  const double inf = std::numeric_limits<double>::infinity();
  const double special[] = {std::nan(""), inf, -inf, 0.0, -0.0};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = edges && i % 29 == 3 ? special[(i / 29) % 5] : dist(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

TEST(ConvBnFoldGpu, MatchesTheCpuBitForBit) {
  QG_REQUIRE_GPU();
  const Shape shapes[] = {{64, 64, 3, 3}, {3, 1500}, {5, 33}, {7, 1}, {2048, 2}};
  for (DType dt : {DType::f32, DType::f64})
    for (const Shape& ws : shapes)
      for (bool edges : {false, true}) {
        const Shape vs{ws[0]};
        Tensor w = data(ws, dt, 1, -1, 1, edges);
        Tensor gamma = data(vs, dt, 2, -2, 2, edges);
        Tensor var = data(vs, dt, 3, 0, 2, edges);
        const Attrs attrs{{"eps", 1e-5}};
        auto cpu = run_op(Device::cpu(), "conv_bn_fold_weight", {w, gamma, var}, attrs);
        auto gpu = run_op(Device::cuda(), "conv_bn_fold_weight", {w, gamma, var}, attrs);
        const std::string label =
            std::string(dtype_name(dt)) + shape_str(ws) + (edges ? " with NaN/Inf/-0" : "");
        for (size_t i = 0; i < 3; ++i)
          EXPECT_EQ(first_difference(cpu[i], gpu[i], NanRule::any_payload), "")
              << label << " forward output " << i;
        Tensor dwf = data(ws, dt, 4, -1, 1, edges), dsf = data(vs, dt, 5, -1, 1, edges);
        auto bcpu =
            run_op(Device::cpu(), "conv_bn_fold_weight_backward", {dwf, dsf, w, cpu[1], cpu[2]});
        auto bgpu =
            run_op(Device::cuda(), "conv_bn_fold_weight_backward", {dwf, dsf, w, cpu[1], cpu[2]});
        for (size_t i = 0; i < 2; ++i)
          EXPECT_EQ(first_difference(bcpu[i], bgpu[i], NanRule::any_payload), "")
              << label << " backward output " << i;
      }
}

}  // namespace
}  // namespace qg
