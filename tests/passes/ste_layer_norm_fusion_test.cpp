// The fuse_ste_backward pass on LayerNorm -> fake-quantize chains (the pre-norm transformer's
// attention and MLP inputs): ste_backward and the layer_norm_backward reading its output
// become one fused_ste_layer_norm_backward node, whose dx, dgamma and dbeta equal the
// unfused graph's bit for bit (CPU), in f32 and f64, with NaN, infinities, signed zeros and
// values the quantizer clips in the data, at lengths that end in a partial mask byte. A
// masked gradient with another reader stays unfused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "runtime/executor.h"
#include "runtime/passes/fuse_ste_backward.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

Tensor data(const Shape& shape, DType dtype, uint64_t seed, double spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, spread);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

// Gradient data with the special values ste_backward must pass or zero.
Tensor gradient_weights(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = data(shape, dtype, seed, 1.0);
  std::vector<double> v = t.to_doubles();
  for (size_t i = 0; i + 12 < v.size(); i += 61) {
    v[i] = -0.0;
    v[i + 4] = NAN;
    v[i + 8] = INFINITY;
    v[i + 12] = -INFINITY;
  }
  return Tensor::from_doubles(shape, v, dtype);
}

struct Chain {
  Graph g;
  std::vector<ValueId> grads;  // dx, dgamma, dbeta
};

// h = layer_norm(x, gamma, beta); y = fake_quantize(h) with qparams from a moving-average
// observer (so later steps clip what falls outside the running range); loss = sum(y * w).
void build(Chain& c, DType dtype, const Shape& shape) {
  const Shape vec{shape.back()};
  ValueId x = c.g.input("x", {dtype, shape});
  ValueId w = c.g.input("w", {dtype, shape});
  ValueId gamma = c.g.input("gamma", {dtype, vec});
  ValueId beta = c.g.input("beta", {dtype, vec});
  ValueId h = c.g.apply("layer_norm", {x, gamma, beta})[0];
  auto qp = c.g.apply("moving_average_observer", {h});
  auto fq = c.g.apply("fake_quantize", {h, qp[0], qp[1]});
  ValueId loss = c.g.apply1("sum", {c.g.apply1("mul", {fq[0], w})});
  c.grads = grad(c.g, loss, {x, gamma, beta});
  const char* names[] = {"dx", "dgamma", "dbeta"};
  for (int i = 0; i < 3; ++i) {
    c.g.set_name(c.grads[i], names[i]);
    c.g.mark_output(c.grads[i]);
  }
}

int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

struct Case {
  DType dtype;
  Shape shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " n=" << shape_numel(c.shape);
}

class SteLayerNormFusion : public ::testing::TestWithParam<Case> {};

TEST_P(SteLayerNormFusion, FusedGradientsEqualUnfusedBitForBit) {
  const Case& k = GetParam();
  Chain plain, fused;
  build(plain, k.dtype, k.shape);
  build(fused, k.dtype, k.shape);
  optimize(plain.g, PassOptions{{"fuse_ste_backward"}});
  auto records = optimize(fused.g, PassOptions{});
  ASSERT_EQ(records.at(1).name, "fuse_ste_backward");
  EXPECT_EQ(records.at(1).rewrites, 1);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_layer_norm_backward"), 1);
  EXPECT_EQ(count_nodes(fused.g, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(fused.g, "layer_norm_backward"), 0);
  EXPECT_EQ(count_nodes(plain.g, "ste_backward"), 1);
  Executor ep(plain.g), ef(fused.g);
  const Shape vec{k.shape.back()};
  for (uint64_t step = 0; step < 3; ++step) {
    // A wider spread each step: the running range lags, so some elements are masked off.
    Executor::Feeds feeds = {{"x", data(k.shape, k.dtype, 10 + step, 1.0 + step)},
                             {"w", gradient_weights(k.shape, k.dtype, 20 + step)},
                             {"gamma", data(vec, k.dtype, 30 + step, 1.0 + step)},
                             {"beta", data(vec, k.dtype, 40 + step, 1.0)}};
    // By name: the fused graph's gradients are the fused node's outputs now.
    std::vector<Tensor> a =
        ep.run(feeds, {plain.g.at("dx"), plain.g.at("dgamma"), plain.g.at("dbeta")});
    std::vector<Tensor> b =
        ef.run(feeds, {fused.g.at("dx"), fused.g.at("dgamma"), fused.g.at("dbeta")});
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].nbytes(), b[i].nbytes());
      EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0)
          << "gradient " << i << ", step " << step;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64}) {
    out.push_back({t, {7, 9}});
    out.push_back({t, {2, 3, 40}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SteLayerNormFusion, ::testing::ValuesIn(cases()));

// The masked gradient of the LayerNorm's output is also fetched: it must stay a value, so
// the pair stays apart and the blocker says why.
TEST(SteLayerNormFusionLegality, MaskedGradientFetchedStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId gamma = g.input("gamma", {DType::f32, {8}});
  ValueId beta = g.input("beta", {DType::f32, {8}});
  ValueId h = g.apply("layer_norm", {x, gamma, beta})[0];
  auto qp = g.apply("minmax_observer", {h});
  auto fq = g.apply("fake_quantize", {h, qp[0], qp[1]});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {fq[0], fq[0]})});
  auto grads = grad(g, loss, {x, h});
  g.mark_output(grads[0]);
  g.mark_output(grads[1]);
  auto records = optimize(g, PassOptions{});
  EXPECT_EQ(records.at(1).rewrites, 0);
  EXPECT_EQ(count_nodes(g, "fused_ste_layer_norm_backward"), 0);
  const NodeId ste = g.value(grads[1]).producer;
  EXPECT_NE(ste_fusion_blocker(g, ste, g.consumers(grads[1]).at(0)), "");
}

TEST(SteLayerNormFusionLegality, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId dy = g.input("dy", {DType::f32, {2, 8}});
  ValueId m = g.input("m", {DType::u8, {2}});
  ValueId v = g.input("v", {DType::f32, {8}});
  ValueId r = g.input("r", {DType::f32, {2}});
  try {
    g.apply("fused_ste_layer_norm_backward", {dy, m, dy, v, r, r});
    FAIL() << "expected qg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_ste_layer_norm_backward"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qg
