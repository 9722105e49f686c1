// The fuse_activation_prologue pass: an activation (relu, gelu, silu) whose only reader is a
// fused observer + quantizer moves into that node, and the activation's output disappears
// from the graph. The fused graph's outputs, gradients and observer state equal the
// unfused graph's bit for bit (CPU), for every activation and float dtype, per tensor and
// per channel, with min/max and moving-average observers, with signed zeros, NaN-free and
// NaN-bearing data. Activations that must stay apart stay apart.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "ops/fused/observe_quantize/observe_quantize_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

Tensor data(const Shape& shape, DType dtype, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  v[1] = -0.0;
  v[3] = 0.0;
  if (specials) {
    v[6] = NAN;
    v[9] = -INFINITY;
  }
  return Tensor::from_doubles(shape, v, dtype);
}

struct Case {
  std::string act;
  Attrs attrs;
  DType dtype;
  Shape shape;
  std::string observer;  // minmax_observer or moving_average_observer
  Attrs scope;           // observer and quantizer scope attributes
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.act << " " << c.attrs.str() << " " << dtype_name(c.dtype) << " " << c.observer << " "
      << c.scope.str();
}

// h = act(x); y = fake_quantize(h) with the case's observer; loss = sum(y * w); outputs y and
// dx = dloss/dx.
Graph build(const Case& c) {
  Graph g;
  ValueId x = g.input("x", {c.dtype, c.shape});
  ValueId w = g.input("w", {c.dtype, c.shape});
  ValueId h = g.apply1(c.act, {x}, c.attrs);
  auto qp = g.apply(c.observer, {h}, c.scope);
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]}, c.scope);
  ValueId loss = g.apply1("sum", {g.apply1("mul", {fq[0], w})});
  ValueId dx = grad(g, loss, {x})[0];
  g.set_name(fq[0], "y");
  g.set_name(dx, "dx");
  g.mark_output(fq[0]);
  g.mark_output(dx);
  return g;
}

int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

int rewrites_of(const std::vector<PassRecord>& records, const std::string& pass) {
  for (const PassRecord& r : records)
    if (r.name == pass) return r.rewrites;
  ADD_FAILURE() << "no pass " << pass;
  return -1;
}

class PrologueFusion : public ::testing::TestWithParam<Case> {};

TEST_P(PrologueFusion, FusedGraphEqualsUnfusedBitForBit) {
  const Case& k = GetParam();
  Graph plain = build(k), fused = build(k);
  optimize(plain, PassOptions{{"fuse_activation_prologue"}});
  auto records = optimize(fused, PassOptions{});
  EXPECT_EQ(rewrites_of(records, "fuse_activation_prologue"), 1);
  EXPECT_EQ(count_nodes(fused, k.act), 0);
  EXPECT_EQ(count_nodes(plain, k.act), 1);
  EXPECT_EQ(count_nodes(fused, "fused_observe_quantize"), 1);
  Executor ep(plain), ef(fused);
  // Three steps: the moving-average state carries over, so later steps check it too.
  for (uint64_t step = 0; step < 3; ++step) {
    const bool specials = step == 2;
    Executor::Feeds feeds = {{"x", data(k.shape, k.dtype, 10 + step, specials)},
                             {"w", data(k.shape, k.dtype, 20 + step, false)}};
    auto a = ep.run(feeds, {plain.at("y"), plain.at("dx")});
    auto b = ef.run(feeds, {fused.at("y"), fused.at("dx")});
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].nbytes(), b[i].nbytes());
      EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0)
          << (i == 0 ? "y" : "dx") << ", step " << step;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const Attrs tensor = {};
  const Attrs channel = {{"scope", "channel"}, {"axis", int64_t{1}}};
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    out.push_back({"relu", {}, t, {8, 16}, "moving_average_observer", tensor});
    out.push_back({"relu", {}, t, {4, 3, 8}, "minmax_observer", channel});
    out.push_back({"gelu", {{"approximate", "none"}}, t, {5, 13}, "minmax_observer", tensor});
    out.push_back(
        {"gelu", {{"approximate", "tanh"}}, t, {4, 16}, "moving_average_observer", tensor});
    out.push_back({"silu", {}, t, {3, 11}, "moving_average_observer", tensor});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Activations, PrologueFusion, ::testing::ValuesIn(cases()));

// h read by the quantizer and by another node: h must stay, so no prologue.
TEST(PrologueFusionLegality, ActivationOutputWithAnotherReaderStays) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId h = g.apply1("relu", {x});
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  g.mark_output(g.apply1("add", {fq[0], h}));
  auto records = optimize(g, PassOptions{});
  EXPECT_EQ(rewrites_of(records, "fuse_activation_prologue"), 0);
  EXPECT_EQ(count_nodes(g, "relu"), 1);
  int checked = 0;
  for (NodeId r : g.consumers(h))
    if (g.node(r).op->name == "fused_observe_quantize") {
      EXPECT_EQ(prologue_fusion_blocker(g, g.value(h).producer, r),
                "the activation's output has another reader");
      ++checked;
    }
  EXPECT_EQ(checked, 1);
}

// A named activation output may be fetched by a run: it stays.
TEST(PrologueFusionLegality, NamedActivationOutputStays) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId h = g.apply1("relu", {x});
  g.set_name(h, "h");
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  g.mark_output(fq[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{}), "fuse_activation_prologue"), 0);
  EXPECT_EQ(count_nodes(g, "relu"), 1);
}

// The activation of a parameter (its readers are ordered before the optimizer step by
// control edges the rebuilt node would not carry): it stays.
TEST(PrologueFusionLegality, ActivationOfParameterStays) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::from_doubles({4, 8}, std::vector<double>(32, 0.5)));
  ValueId h = g.apply1("relu", {p});
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  g.mark_output(fq[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{}), "fuse_activation_prologue"), 0);
  EXPECT_EQ(count_nodes(g, "relu"), 1);
}

// Not an activation the fused kernels know (here: neg), or an unfused quantizer: nothing.
TEST(PrologueFusionLegality, OtherProducersAndUnfusedQuantizersStay) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId h = g.apply1("neg", {x});
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  g.mark_output(fq[0]);
  EXPECT_EQ(
      rewrites_of(optimize(g, PassOptions{{"fuse_observer_quantize"}}), "fuse_activation_prologue"),
      0);
  Graph g2;
  ValueId x2 = g2.input("x", {DType::f32, {4, 8}});
  ValueId h2 = g2.apply1("relu", {x2});
  auto qp2 = g2.apply("minmax_observer", {h2});
  g2.mark_output(g2.apply("fake_quantize", {h2, qp2[0], qp2[1]})[0]);
  EXPECT_EQ(rewrites_of(optimize(g2, PassOptions{{"fuse_observer_quantize"}}),
                        "fuse_activation_prologue"),
            0);
  EXPECT_EQ(count_nodes(g2, "relu"), 1);
}

}  // namespace
}  // namespace qg
