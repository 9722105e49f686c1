// conv2d and its backward ops on the GPU (im2col + cuBLAS) against the CPU kernels, for
// strides, padding, dilation, groups (depthwise too), the 1x1 path without im2col, and a
// batch large enough that the 256 MiB im2col workspace is used in several chunks. Skipped
// without a GPU. Tolerance 1e-5 in f32 and 1e-12 in f64, relative to the sum of the
// absolute values of the terms behind each output (the same op on |inputs|, in f64): the
// GEMMs and the bias sum add in a different order on each device (their definitions mark
// these outputs as rounded for the cross-check), so the rounding grows with those terms, not with
// the result, which may cancel to near zero.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/gpu/gpu_test_util.h"
#include "tests/ops_conv/conv_reference.h"

namespace qg {
namespace {

using testing::ConvCase;
using testing::run_op;

Tensor random_tensor(const Shape& s, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& e : v) e = u(rng);
  return Tensor::from_doubles(s, v, dt);
}

Tensor abs_f64(const Tensor& t) {
  std::vector<double> v = t.to_doubles();
  for (double& e : v) e = std::abs(e);
  return Tensor::from_doubles(t.shape(), v, DType::f64);
}

void expect_close(const Tensor& gpu, const Tensor& cpu, const Tensor& scale, double tol,
                  const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  auto g = gpu.to_doubles(), c = cpu.to_doubles(), s = scale.to_doubles();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(g[i] - c[i]), tol * std::max(s[i], 1e-300))
        << what << " [" << i << "]: gpu " << g[i] << ", cpu " << c[i] << ", terms " << s[i];
}

void compare_devices(const ConvCase& k, DType dt, uint32_t seed) {
  const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
  Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c / k.groups, k.kh, k.kw}, ys{k.n, k.o, k.ho(), k.wo()};
  Tensor x = random_tensor(xs, dt, seed), w = random_tensor(ws, dt, seed + 1);
  Tensor b = random_tensor({k.o}, dt, seed + 2), dy = random_tensor(ys, dt, seed + 3);
  Attrs a = {{"stride", {k.sh, k.sw}},
             {"padding", {k.ph, k.pw}},
             {"dilation", {k.dh, k.dw}},
             {"groups", k.groups}};
  Attrs ai = a, aw = a;
  ai.set("input_shape", xs);
  aw.set("weight_shape", ws);
  struct Call {
    const char* op;
    std::vector<Tensor> inputs;
    Attrs attrs;
  };
  const Call calls[] = {{"conv2d", {x, w, b}, a},
                        {"conv2d_backward_input", {dy, w}, ai},
                        {"conv2d_backward_weight", {dy, x}, aw},
                        {"conv2d_backward_bias", {dy}, {}}};
  for (const Call& c : calls) {
    Tensor gpu = run_op(Device::cuda(), c.op, c.inputs, c.attrs)[0];
    Tensor cpu = run_op(Device::cpu(), c.op, c.inputs, c.attrs)[0];
    std::vector<Tensor> abs_inputs;
    for (const Tensor& t : c.inputs) abs_inputs.push_back(abs_f64(t));
    Tensor scale = run_op(Device::cpu(), c.op, abs_inputs, c.attrs)[0];
    expect_close(gpu, cpu, scale, tol, std::string(c.op) + " " + dtype_name(dt));
  }
}

TEST(Conv2dGpu, MatchesCpuForwardAndBackward) {
  QG_REQUIRE_GPU();
  const ConvCase cases[] = {
      {2, 3, 7, 6, 4, 3, 3},                         // plain
      {2, 2, 9, 8, 3, 3, 2, 2, 3, 1, 0},             // stride [2, 3], padding [1, 0]
      {1, 2, 9, 9, 2, 3, 3, 1, 1, 2, 2, 2, 3},       // dilation [2, 3], padding 2
      {3, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2},    // groups 2
      {2, 3, 8, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 3},    // depthwise, multiplier 2
      {4, 8, 10, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8},  // depthwise, multiplier 1
      {3, 4, 5, 5, 3, 1, 1},                         // 1x1, no im2col
      {2, 4, 5, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2},    // 1x1 grouped
      {2, 6, 11, 10, 4, 3, 2, 2, 3, 2, 1, 2, 3, 2},  // everything at once
      {0, 3, 5, 5, 2, 3, 3},                         // empty batch: dw and db are zeros
  };
  uint32_t seed = 10;
  for (const ConvCase& k : cases) {
    SCOPED_TRACE("N " + std::to_string(k.n) + " C " + std::to_string(k.c) + " O " +
                 std::to_string(k.o) + " groups " + std::to_string(k.groups));
    for (DType dt : {DType::f32, DType::f64}) compare_devices(k, dt, seed);
    seed += 10;
  }
}

TEST(Conv2dGpu, LargeBatchRunsInWorkspaceChunks) {
  // One image's im2col matrix is 64 * 9 * 64 * 64 * 4 B = 9 MiB, so the 256 MiB workspace
  // takes 28 of the 64 images: three chunks, the last one short.
  QG_REQUIRE_GPU();
  compare_devices({64, 64, 64, 64, 16, 3, 3, 1, 1, 1, 1}, DType::f32, 7);
}

}  // namespace
}  // namespace qg
