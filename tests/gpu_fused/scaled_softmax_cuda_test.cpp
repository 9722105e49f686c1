// The CUDA kernels of fused_scaled_softmax(_backward) (one warp-row pass: the mul's rounding,
// the softmax, then the backward's mul) against the same graph run unfused on the GPU: y and
// dx bit for bit, every float dtype, rows of 1 to 1500 (warp rows, and the composed fallback
// for block rows and a scale that is the mul's first operand), NaN, infinities and signed
// zeros in the data; and the GPU against the CPU within the crosscheck's softmax tolerance.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "runtime/backend.h"
#include "runtime/crosscheck.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/scaled_softmax_graphs.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::first_difference;
using testing::special_data;

struct Case {
  DType dtype;
  int64_t len;
  bool scale_first;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " len " << c.len << (c.scale_first ? " mul(s, x)" : " mul(x, s)");
}

Shape case_shape(const Case& c) {
  return {5, 7, c.len};
}

void build(Graph& g, const Case& c) {
  testing::build_scaled_softmax(g, c.dtype, case_shape(c),
                                Tensor::scalar(1.0 / std::sqrt(48.0), c.dtype), c.scale_first);
}

// GPU against the CPU as the crosscheck compares softmax outputs.
void expect_within_tolerance(const Tensor& cpu, const Tensor& gpu, DType dtype,
                             const std::string& what) {
  CrosscheckMismatch m;
  double worst = 0;
  EXPECT_TRUE(compare_tensors(cpu, gpu, compare_rule("softmax", -1, dtype), m, worst))
      << what << ": " << m.str();
}

class ScaledSoftmaxCuda : public ::testing::TestWithParam<Case> {};

TEST_P(ScaledSoftmaxCuda, FusedKernelsEqualUnfusedKernelsAndMatchTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const Case& c = GetParam();
  Graph plain, fused;
  build(plain, c);
  build(fused, c);
  optimize(plain, PassOptions{{"fuse_scaled_softmax"}});
  optimize(fused, PassOptions{});
  ASSERT_EQ(testing::count_nodes(fused, "fused_scaled_softmax"), 1);
  ASSERT_EQ(testing::count_nodes(fused, "fused_scaled_softmax_backward"), 1);
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(fused);
  for (uint64_t step = 0; step < 2; ++step) {
    Executor::Feeds feeds = {{"x", special_data(case_shape(c), c.dtype, 10 + step, 3.0)},
                             {"w", special_data(case_shape(c), c.dtype, 20 + step)}};
    auto a = ep.run(feeds, {plain.at("y"), plain.at("dx")});
    auto b = ef.run(feeds, {fused.at("y"), fused.at("dx")});
    auto r = cpu.run(feeds, {fused.at("y"), fused.at("dx")});
    const char* names[] = {"y", "dx"};
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(first_difference(a[i], b[i]), "") << names[i] << ", step " << step;
      expect_within_tolerance(
          r[i], b[i], c.dtype,
          std::string(names[i]) + " against the CPU, step " + std::to_string(step));
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (int64_t len : {1, 31, 32, 33, 100, 512, 1000, 1024, 1500}) out.push_back({t, len, false});
  for (DType t : {DType::f32, DType::f64}) out.push_back({t, 512, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Rows, ScaledSoftmaxCuda, ::testing::ValuesIn(cases()));

// The plain softmax's warp-row kernels (the row held in registers, every K) against the CPU,
// NaN and infinities included.
TEST(SoftmaxWarpRowsCuda, PlainSoftmaxMatchesTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (int64_t len : {1, 17, 64, 65, 200, 512, 999, 1024}) {
      Graph g;
      ValueId x = g.input("x", {t, {9, len}});
      ValueId dy = g.input("dy", {t, {9, len}});
      ValueId y = g.apply1("softmax", {x}, {{"axis", -1}});
      ValueId dx = g.apply1("softmax_backward", {dy, y}, {{"axis", -1}});
      g.mark_output(y);
      g.mark_output(dx);
      Executor eg(g, Device::cuda()), ec(g);
      Executor::Feeds feeds = {{"x", special_data({9, len}, t, 3, 2.0)},
                               {"dy", special_data({9, len}, t, 4)}};
      auto a = ec.run(feeds, {y, dx});
      auto b = eg.run(feeds, {y, dx});
      const std::string what = std::string(dtype_name(t)) + " len " + std::to_string(len);
      expect_within_tolerance(a[0], b[0], t, what + " y");
      expect_within_tolerance(a[1], b[1], t, what + " dx");
    }
}

}  // namespace
}  // namespace qg
