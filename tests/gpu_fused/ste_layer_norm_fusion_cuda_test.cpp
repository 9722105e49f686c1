// The CUDA kernel of fused_ste_layer_norm_backward (layer_norm_backward's kernels reading dy
// through the STE mask) against the same graph run unfused on the GPU: dx, dgamma and dbeta
// bit for bit, in f32 and f64, at row lengths that end in a partial mask byte and at the
// transformer's [4096, 768], with NaN, infinities and signed zeros in the incoming gradient
// and elements the quantizer clips. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "autograd/grad.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/tensor_compare.h"

namespace qg {
namespace {

using testing::first_difference;

struct Case {
  DType dtype;
  Shape shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " n=" << shape_numel(c.shape);
}

Tensor data(const Shape& shape, DType dtype, uint64_t seed, double spread, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, spread);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  if (specials)
    for (size_t i = 0; i + 30 < v.size(); i += 997) {
      v[i] = -0.0;
      v[i + 10] = NAN;
      v[i + 20] = INFINITY;
      v[i + 30] = -INFINITY;
    }
  return Tensor::from_doubles(shape, v, dtype);
}

// x -> layer_norm -> moving-average observer + fake_quantize -> sum(y * w); the gradients of
// x, gamma and beta, named (the fused graph's are the fused node's outputs: fetched by name).
std::vector<std::string> build(Graph& g, const Case& c) {
  const Shape vec{c.shape.back()};
  ValueId x = g.input("x", {c.dtype, c.shape});
  ValueId w = g.input("w", {c.dtype, c.shape});
  ValueId gamma = g.input("gamma", {c.dtype, vec});
  ValueId beta = g.input("beta", {c.dtype, vec});
  ValueId h = g.apply("layer_norm", {x, gamma, beta})[0];
  auto qp = g.apply("moving_average_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  auto grads = grad(g, g.apply1("sum", {g.apply1("mul", {fq[0], w})}), {x, gamma, beta});
  const std::vector<std::string> names = {"dx", "dgamma", "dbeta"};
  for (size_t i = 0; i < grads.size(); ++i) {
    g.set_name(grads[i], names[i]);
    g.mark_output(grads[i]);
  }
  return names;
}

class SteLayerNormFusionCuda : public ::testing::TestWithParam<Case> {};

TEST_P(SteLayerNormFusionCuda, FusedKernelsEqualUnfusedKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const Case& c = GetParam();
  Graph plain, fused;
  const auto names = build(plain, c);
  build(fused, c);
  optimize(plain, PassOptions{{"fuse_ste_backward"}});
  ASSERT_EQ(optimize(fused, PassOptions{}).at(1).rewrites, 1);
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda());
  const Shape vec{c.shape.back()};
  for (uint64_t step = 0; step < 3; ++step) {
    Executor::Feeds feeds = {{"x", data(c.shape, c.dtype, 10 + step, 1.0 + step, false)},
                             {"w", data(c.shape, c.dtype, 20 + step, 1.0, true)},
                             {"gamma", data(vec, c.dtype, 30 + step, 1.0 + step, false)},
                             {"beta", data(vec, c.dtype, 40 + step, 1.0, false)}};
    auto a = ep.run_named(feeds, names);
    auto b = ef.run_named(feeds, names);
    for (const std::string& name : names)
      EXPECT_EQ(first_difference(a.at(name), b.at(name)), "") << name << ", step " << step;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64})
    for (Shape s : {Shape{3, 5}, Shape{257, 1001}, Shape{8, 512, 768}}) out.push_back({t, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SteLayerNormFusionCuda, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace qg
