// The TF32 switch (the precision flags of the executor's DeviceContext): off, f32 matmul /
// batched_matmul / conv2d on the GPU agree with the CPU within 1e-5 of the largest output;
// on, the GEMMs really run in TF32 (their error grows past 1e-5, which f32 FMA math never
// reaches at these sizes) yet stays within TF32's bound; switched off again, the exact
// results come back (the cuDNN algorithm cache is keyed by the setting). Skipped without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::random_f32;
using testing::relative_error;
using testing::run_op;
using testing::tf32;

struct Case {
  const char* op;
  std::vector<Tensor> inputs;
  Attrs attrs;
};

std::vector<Case> cases() {
  return {{"matmul", {random_f32({96, 512}, 1), random_f32({512, 80}, 2)}, {}},
          {"batched_matmul",
           {random_f32({4, 64, 384}, 3), random_f32({4, 384, 48}, 4)},
           {{"transpose_a", false}, {"transpose_b", false}}},
          {"conv2d",
           {random_f32({8, 64, 16, 16}, 5), random_f32({64, 64, 3, 3}, 6), random_f32({64}, 7)},
           {{"stride", {1, 1}}, {"padding", {1, 1}}, {"dilation", {1, 1}}, {"groups", 1}}}};
}

TEST(Tf32Switch, OffExactOnTf32OffExactAgain) {
  QG_REQUIRE_GPU();
  for (const Case& c : cases()) {
    Tensor cpu = run_op(Device::cpu(), c.op, c.inputs, c.attrs)[0];
    auto gpu = [&](bool on) {
      return relative_error(run_op(Device::cuda(), c.op, c.inputs, c.attrs, 1, tf32(on))[0], cpu);
    };
    double off = gpu(false);
    double on = gpu(true);
    double again = gpu(false);
    EXPECT_LE(off, 1e-5) << c.op;
    EXPECT_LE(again, 1e-5) << c.op;
    // TF32 rounds each operand to 10 mantissa bits (relative 2^-11 = 4.9e-4); with
    // K = 384..576 terms of random sign the error of the sum stays far below that bound
    // relative to the largest output.
    EXPECT_LE(on, 4.9e-4) << c.op;
    // The cuBLAS GEMMs must have used TF32 (cuDNN may legitimately pick an FMA algorithm).
    if (std::string(c.op) != "conv2d") {
      EXPECT_GT(on, 1e-5) << c.op << ": TF32 was not used";
    }
    std::printf("%-15s relative error: off %.2e, TF32 %.2e, off again %.2e\n", c.op, off, on,
                again);
  }
}

}  // namespace
}  // namespace qg
