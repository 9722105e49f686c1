// The CUDA quantize kernel's one-qparam-per-mask-byte path (quantize_runs_kernel): codes and
// masks bit for bit against the CPU for every scope whose qparams cover runs of 8 elements
// (per-row and per-group quantizers of a matrix, as the integer forward uses them, per tensor
// and per token), every float dtype, with NaN, infinities and values far out of range; and
// the per-element path still taken where runs are shorter (a per-column quantizer).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::run_op;
using testing::same_bits;

struct Case {
  Shape x, q;
  Attrs attrs;
};

TEST(QuantizeGpu, RunsOfEightMatchTheCpu) {
  QG_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {{37, 64}, {37}, {{"scope", "channel"}, {"axis", 0}}},
      {{5, 128}, {5, 4}, {{"scope", "group"}, {"axis", 1}, {"group_size", 32}}},
      {{6, 2816}, {6, 88}, {{"scope", "group"}, {"axis", 1}, {"group_size", 32}}},
      {{4, 3, 16}, {4, 3, 1}, {{"scope", "token"}}},
      {{1000, 8}, {1}, {{"scope", "tensor"}}},
      {{40, 24}, {24}, {{"scope", "channel"}, {"axis", 1}}}};  // runs of 1: per element
  uint32_t seed = 3;
  for (const Case& c : cases)
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      SCOPED_TRACE(shape_str(c.x) + " " + dtype_name(d));
      Tensor x = testing::random_f32(c.x, seed++);
      float* xv = x.data<float>();
      const float inf = std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < x.numel(); i += 13) xv[i] *= 400.0f;  // out of range
      xv[3] = std::nanf("");
      xv[x.numel() - 2] = inf;
      xv[x.numel() / 2] = -inf;
      Tensor scale = testing::random_f32(c.q, seed++);
      for (int64_t i = 0; i < scale.numel(); ++i)
        scale.data<float>()[i] = 0.01f + std::abs(scale.data<float>()[i]) * 0.02f;
      std::vector<int32_t> zp(static_cast<size_t>(scale.numel()));
      for (size_t i = 0; i < zp.size(); ++i) zp[i] = static_cast<int32_t>(i * 37 % 256) - 128;
      Attrs a = c.attrs;
      a.set("quant_min", -128);
      a.set("quant_max", 127);
      std::vector<Tensor> in = {x.cast(d), scale, Tensor::from_vector<int32_t>(c.q, zp)};
      auto cpu = run_op(Device::cpu(), "quantize", in, a);
      auto gpu = run_op(Device::cuda(), "quantize", in, a);
      EXPECT_TRUE(same_bits(cpu[0], gpu[0])) << "codes";
      EXPECT_TRUE(same_bits(cpu[1], gpu[1])) << "mask";
    }
}

}  // namespace
}  // namespace qg
