// The CUDA kernel of a fused observer + fake-quantize node with an activation prologue
// (fuse_activation_prologue: relu, gelu or silu applied as x is loaded) against the same
// graph with the activation left as its own node, both on the GPU: the quantized output
// and the input gradient bit for bit over three steps of a moving-average observer, for
// every activation and float dtype, in shapes that take the cooperative per-tensor kernel
// and shapes or scopes that fall back to the activation's kernel into a temporary; with
// NaN, infinities and signed zeros in the data. relu is also compared with the CPU bit for
// bit (gelu and silu use CUDA's libm there; a NaN output's payload may differ, see below).
// Skips without a GPU.
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
  Attrs scope;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.act << " " << c.attrs.str() << " " << dtype_name(c.dtype)
      << " n=" << shape_numel(c.shape) << " " << c.scope.str();
}

Tensor data(const Case& c, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(c.shape)));
  for (auto& x : v) x = d(rng);
  for (size_t i = 0; i + 40 < v.size(); i += 997) {
    v[i] = -0.0;
    if (!specials) continue;
    v[i + 9] = NAN;
    v[i + 18] = INFINITY;
    v[i + 27] = -INFINITY;
  }
  return Tensor::from_doubles(c.shape, v, c.dtype);
}

Graph build(const Case& c) {
  Graph g;
  ValueId x = g.input("x", {c.dtype, c.shape});
  ValueId w = g.input("w", {c.dtype, c.shape});
  ValueId h = g.apply1(c.act, {x}, c.attrs);
  auto qp = g.apply("moving_average_observer", {h}, c.scope);
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]}, c.scope);
  ValueId dx = grad(g, g.apply1("sum", {g.apply1("mul", {fq[0], w})}), {x})[0];
  g.set_name(fq[0], "y");
  g.set_name(dx, "dx");
  g.mark_output(fq[0]);
  g.mark_output(dx);
  return g;
}

class PrologueFusionCuda : public ::testing::TestWithParam<Case> {};

TEST_P(PrologueFusionCuda, FusedKernelEqualsUnfusedKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const Case& c = GetParam();
  Graph plain = build(c), fused = build(c), ref = build(c);
  optimize(plain, PassOptions{{"fuse_activation_prologue"}});
  int rewrites = -1;
  for (const PassRecord& r : optimize(fused, PassOptions{}))
    if (r.name == "fuse_activation_prologue") rewrites = r.rewrites;
  ASSERT_EQ(rewrites, 1);
  optimize(ref, PassOptions{{"all"}});
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(ref);
  for (uint64_t step = 0; step < 3; ++step) {
    Executor::Feeds feeds = {{"x", data(c, 10 + step, step == 1)},
                             {"w", data(c, 20 + step, false)}};
    auto a = ep.run(feeds, {plain.at("y"), plain.at("dx")});
    auto b = ef.run(feeds, {fused.at("y"), fused.at("dx")});
    EXPECT_EQ(first_difference(a[0], b[0]), "") << "y, step " << step;
    EXPECT_EQ(first_difference(a[1], b[1]), "") << "dx, step " << step;
    if (c.act == "relu") {
      auto r = cpu.run(feeds, {ref.at("y"), ref.at("dx")});
      // NaN in, NaN out (SEMANTICS.md) but not the same NaN: f32 arithmetic on a NaN keeps
      // its payload on x86 and gives the canonical NaN in CUDA, in the unfused
      // fake_quantize kernels as much as here (the GPU-vs-GPU checks above are exact).
      EXPECT_EQ(first_difference(r[0], b[0], NanRule::any_payload), "")
          << "y against the CPU, step " << step;
      EXPECT_EQ(first_difference(r[1], b[1]), "") << "dx against the CPU, step " << step;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const Attrs tensor = {};
  const Attrs channel = {{"scope", "channel"}, {"axis", int64_t{1}}};
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    // {64, 768} and {32, 64, 16, 16}: whole warps of packs, the cooperative kernel;
    // {257, 1001}: not, the fallback.
    for (Shape s : {Shape{64, 768}, Shape{32, 64, 16, 16}, Shape{257, 1001}}) {
      out.push_back({"relu", {}, t, s, tensor});
      out.push_back({"gelu", {{"approximate", "none"}}, t, s, tensor});
      out.push_back({"gelu", {{"approximate", "tanh"}}, t, s, tensor});
      out.push_back({"silu", {}, t, s, tensor});
    }
    out.push_back({"relu", {}, t, {32, 64, 16, 16}, channel});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Activations, PrologueFusionCuda, ::testing::ValuesIn(cases()));

}  // namespace
}  // namespace qg
