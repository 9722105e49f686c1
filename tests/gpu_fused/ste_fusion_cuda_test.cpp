// The CUDA kernel of fused_ste_backward (ste_backward + relu/gelu/silu backward in one pass)
// against the same graph run unfused on the GPU: the gradient bit for bit, for every
// activation and float dtype, at lengths that end in a partial mask byte or fill whole
// 16-byte packs, with NaN, infinities and signed zeros in the data. relu's gradient is also
// compared with the CPU bit for bit (gelu and silu use CUDA's libm there). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/tensor_compare.h"

namespace qg {
namespace {

using testing::first_difference;
using testing::NanRule;

struct Case {
  std::string act;
  Attrs attrs;
  DType dtype;
  Shape shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.act << " " << c.attrs.str() << " " << dtype_name(c.dtype)
      << " n=" << shape_numel(c.shape);
}

Tensor data(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(c.shape)));
  for (auto& x : v) x = d(rng);
  for (size_t i = 0; i + 40 < v.size(); i += 997) {  // specials at every position of a pack
    v[i] = -0.0;
    v[i + 9] = NAN;
    v[i + 18] = INFINITY;
    v[i + 27] = -INFINITY;
    v[i + 36] = 50.0;  // outside the range the other values span: masked off
  }
  return Tensor::from_doubles(c.shape, v, c.dtype);
}

// x -> act -> minmax observer + fake_quantize -> sum(y * w); returns the graph's dx.
ValueId build(Graph& g, const Case& c) {
  ValueId x = g.input("x", {c.dtype, c.shape});
  ValueId w = g.input("w", {c.dtype, c.shape});
  ValueId h = g.apply1(c.act, {x}, c.attrs);
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  ValueId dx = grad(g, g.apply1("sum", {g.apply1("mul", {fq[0], w})}), {x})[0];
  g.set_name(dx, "dx");
  g.mark_output(dx);
  return dx;
}

class SteFusionCuda : public ::testing::TestWithParam<Case> {};

TEST_P(SteFusionCuda, FusedKernelEqualsUnfusedKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const Case& c = GetParam();
  Graph plain, fused, ref;
  build(plain, c);
  build(fused, c);
  build(ref, c);
  optimize(plain, PassOptions{{"fuse_ste_backward"}});
  ASSERT_EQ(optimize(fused, PassOptions{}).at(2).rewrites, 1);
  optimize(ref, PassOptions{{"all"}});
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(ref);
  for (uint64_t step = 0; step < 2; ++step) {
    Executor::Feeds feeds = {{"x", data(c, 10 + step)}, {"w", data(c, 20 + step)}};
    Tensor a = ep.run(feeds, {plain.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.at("dx")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "step " << step;
    if (c.act == "relu") {
      Tensor r = cpu.run(feeds, {ref.at("dx")})[0];
      EXPECT_EQ(first_difference(r, b), "") << "against the CPU, step " << step;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (Shape s : {Shape{3, 5}, Shape{64, 768}, Shape{257, 1001}}) {
      out.push_back({"relu", {}, t, s});
      out.push_back({"gelu", {{"approximate", "none"}}, t, s});
      out.push_back({"gelu", {{"approximate", "tanh"}}, t, s});
      out.push_back({"silu", {}, t, s});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Activations, SteFusionCuda, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace qg
