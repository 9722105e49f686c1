// The fuse_ste_backward pass: activation -> fake-quantize chains whose backward runs
// ste_backward then the activation's backward are fused into one node; the fused graph's
// gradients equal the unfused graph's bit for bit (CPU), for relu, gelu (both forms) and
// silu in f32, f64, bf16 and f16, with signed zeros, NaN and infinities in the data and
// lengths that end in a partial mask byte. Pairs that must stay apart stay apart.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "ops/fused/ste_backward/ste_backward_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

Tensor data(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  if (v.size() >= 16) {
    v[1] = -0.0;
    v[3] = 0.0;
    v[6] = NAN;
    v[9] = INFINITY;
    v[v.size() - 1] = -INFINITY;
    v[v.size() / 2] = 40.0;  // far outside the observed range of the other steps: masked
  }
  return Tensor::from_doubles(shape, v, dtype);
}

struct Chain {
  Graph g;
  ValueId dx = kNoValue;
};

// h = act(x); y = fake_quantize(h) with min/max qparams; loss = sum(y * w); dx = dloss/dx.
void build(Chain& c, const std::string& act, const Attrs& act_attrs, DType dtype,
           const Shape& shape) {
  ValueId x = c.g.input("x", {dtype, shape});
  ValueId w = c.g.input("w", {dtype, shape});
  ValueId h = c.g.apply1(act, {x}, act_attrs);
  auto qp = c.g.apply("minmax_observer", {h});
  auto fq = c.g.apply("fake_quantize", {h, qp[0], qp[1]});
  ValueId loss = c.g.apply1("sum", {c.g.apply1("mul", {fq[0], w})});
  c.dx = grad(c.g, loss, {x})[0];
  c.g.set_name(c.dx, "dx");
  c.g.mark_output(c.dx);
}

int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

struct Case {
  std::string act;
  Attrs attrs;
  DType dtype;
  Shape shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.act << " " << c.attrs.str() << " " << dtype_name(c.dtype);
}

class SteFusion : public ::testing::TestWithParam<Case> {};

TEST_P(SteFusion, FusedGradientEqualsUnfusedBitForBit) {
  const Case& k = GetParam();
  Chain plain, fused;
  build(plain, k.act, k.attrs, k.dtype, k.shape);
  build(fused, k.act, k.attrs, k.dtype, k.shape);
  optimize(plain.g, PassOptions{{"fuse_ste_backward"}});
  auto records = optimize(fused.g, PassOptions{});
  ASSERT_EQ(records.at(2).name, "fuse_ste_backward");
  EXPECT_EQ(records.at(2).rewrites, 1);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_backward"), 1);
  EXPECT_EQ(count_nodes(fused.g, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(plain.g, "ste_backward"), 1);
  Executor ep(plain.g), ef(fused.g);
  for (uint64_t step = 0; step < 3; ++step) {
    Executor::Feeds feeds = {{"x", data(k.shape, k.dtype, 10 + step)},
                             {"w", data(k.shape, k.dtype, 20 + step)}};
    Tensor a = ep.run(feeds, {plain.g.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.g.at("dx")})[0];
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "step " << step;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    out.push_back({"relu", {}, t, {7, 9}});
    out.push_back({"gelu", {{"approximate", "none"}}, t, {5, 13}});
    out.push_back({"gelu", {{"approximate", "tanh"}}, t, {4, 16}});
    out.push_back({"silu", {}, t, {3, 11}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Activations, SteFusion, ::testing::ValuesIn(cases()));

// The masked gradient also read by another node (here: the gradient of h is requested
// too, so it is a graph output and has the activation backward as reader): no fusion.
TEST(SteFusionLegality, MaskedGradientWithAnotherUseStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId h = g.apply1("relu", {x});
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {fq[0], fq[0]})});
  auto grads = grad(g, loss, {x, h});
  g.mark_output(grads[0]);
  g.mark_output(grads[1]);
  // fuse_ste_producer off: it would (legally) fold this ste_backward into the add that sums
  // the two mul paths' gradients, and the checks below look at the ste_backward node.
  auto records = optimize(g, PassOptions{{"fuse_ste_producer"}});
  EXPECT_EQ(records.at(2).rewrites, 0);
  EXPECT_EQ(count_nodes(g, "ste_backward"), 1);
  const NodeId ste = g.value(grads[1]).producer;
  const NodeId act = g.consumers(grads[1]).at(0);
  EXPECT_NE(ste_fusion_blocker(g, ste, act), "");
}

// A fake-quantizer reading the input directly: its STE gradient feeds no activation.
TEST(SteFusionLegality, NoActivationBackwardNoFusion) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  ValueId h = g.apply1("relu", {fq[0]});
  ValueId loss = g.apply1("sum", {h});
  g.mark_output(grad(g, loss, {x})[0]);
  auto records = optimize(g, PassOptions{});
  EXPECT_EQ(records.at(2).rewrites, 0);
  EXPECT_EQ(count_nodes(g, "fused_ste_backward"), 0);
}

TEST(SteFusionLegality, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId dy = g.input("dy", {DType::f32, {8}});
  ValueId m = g.input("m", {DType::u8, {1}});
  try {
    g.apply1("fused_ste_backward", {dy, m, dy});
    FAIL() << "expected qg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_ste_backward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qg
