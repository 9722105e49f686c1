// The observer + quantizer fusion pass, tested three ways: kernels launched, fused ==
// unfused (outputs, masks and state, bit for bit), and cases where fusion must not happen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "ops/fused/observe_quantize/observe_quantize_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, double scale = 3.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  // Signed zeros, NaN and infinities exercise the statistics' edge rules.
  if (v.size() >= 16) {
    v[1] = -0.0;
    v[3] = 0.0;
    v[7] = NAN;
    v[v.size() - 2] = INFINITY;
    v[v.size() / 2] = -INFINITY;
  }
  return Tensor::from_doubles(shape, v);
}

struct Chain {
  Graph g;
  ValueId x, y, mask, dx;
};

// x -> observer -> fake_quantize -> y; loss = sum(y * y) and its STE gradient.
void build_chain(Chain& c, const Shape& shape, const std::string& observer, const Attrs& attrs,
                 const Attrs& observer_only) {
  c.x = c.g.input("x", {DType::f32, shape});
  Attrs obs_attrs = attrs;
  for (const auto& [k, v] : observer_only.items()) obs_attrs.set(k, v);
  auto qp = c.g.apply(observer, {c.x}, obs_attrs);
  auto fq = c.g.apply("fake_quantize", {c.x, qp[0], qp[1]}, attrs);
  c.g.set_name(fq[0], "y");  // fusion replaces these values; names carry over
  c.g.set_name(fq[1], "mask");
  ValueId loss = c.g.apply1("sum", {c.g.apply1("mul", {fq[0], fq[0]})});
  c.g.set_name(grad(c.g, loss, {c.x})[0], "dx");
}

// Value ids after any pass ran.
void resolve(Chain& c) {
  c.y = c.g.at("y");
  c.mask = c.g.at("mask");
  c.dx = c.g.at("dx");
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Case {
  std::string observer;
  Shape shape;
  Attrs attrs;          // shared by the observer and fake_quantize
  Attrs observer_only;  // qscheme and the like
};

class FusedEqualsUnfused : public ::testing::TestWithParam<Case> {};

TEST_P(FusedEqualsUnfused, OutputsMasksAndStateBitForBit) {
  const Case& k = GetParam();
  if (OpRegistry::instance().find(k.observer) == nullptr)
    GTEST_SKIP() << k.observer << " not built";
  Chain plain, fused;
  build_chain(plain, k.shape, k.observer, k.attrs, k.observer_only);
  build_chain(fused, k.shape, k.observer, k.attrs, k.observer_only);
  auto records = optimize(fused.g, PassOptions{});
  ASSERT_EQ(records.at(1).rewrites, 1);
  EXPECT_EQ(optimize(plain.g, PassOptions{{"fuse_observer_quantize"}}).at(1).rewrites, 0);
  resolve(plain);
  resolve(fused);

  Executor ep(plain.g), ef(fused.g);
  int plain_quant_nodes = 0, fused_quant_nodes = 0;
  ep.on_node = [&](const Node& n, const std::vector<Tensor>&) {
    plain_quant_nodes += n.op->name == "fake_quantize" || n.op->name == k.observer;
  };
  ef.on_node = [&](const Node& n, const std::vector<Tensor>&) {
    fused_quant_nodes += n.op->name == "fused_observe_quantize";
  };
  for (uint64_t step = 0; step < 3; ++step) {
    Tensor x = random_tensor(k.shape, 100 + step, 1.0 + step);
    auto a = ep.run({{"x", x}}, {plain.y, plain.mask, plain.dx});
    auto b = ef.run({{"x", x}}, {fused.y, fused.mask, fused.dx});
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(same_bits(a[i], b[i])) << "output " << i << " step " << step;
  }
  EXPECT_EQ(plain_quant_nodes, 6);  // observer + fake_quantize, three steps
  EXPECT_EQ(fused_quant_nodes, 3);  // one fused node per step
  // The fused node's states are the observer's followed by the quantizer's.
  NodeId obs_plain =
      plain.g.value(plain.g.node(plain.g.value(plain.y).producer).inputs[1]).producer;
  NodeId fused_node = fused.g.value(fused.y).producer;
  const auto& sp = ep.states(obs_plain);
  const auto& sf = ef.states(fused_node);
  for (size_t i = 0; i < sp.size(); ++i) EXPECT_TRUE(same_bits(sp[i], sf[i])) << "state " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Scopes, FusedEqualsUnfused,
    ::testing::Values(
        Case{"minmax_observer", {16, 33}, {}, {}},
        Case{"minmax_observer", {7, 5}, {{"signed", true}}, {{"qscheme", "symmetric"}}},
        Case{"minmax_observer", {6, 9}, {{"scope", "channel"}, {"axis", 0}}, {}},
        Case{"minmax_observer", {6, 9}, {{"scope", "channel"}, {"axis", -1}, {"bits", 4}}, {}},
        Case{"moving_average_observer", {16, 33}, {}, {}},
        Case{"moving_average_observer", {6, 9}, {{"scope", "channel"}, {"axis", 1}}, {}},
        // rows of 8k elements: the CPU single-loop row path
        Case{"minmax_observer", {5, 16}, {{"scope", "channel"}, {"axis", 0}, {"signed", true}}, {}},
        Case{"moving_average_observer", {5, 32}, {{"scope", "channel"}, {"axis", -2}}, {}},
        Case{"minmax_observer", {4, 8}, {}, {{"qscheme", "symmetric"}}},
        // delayed mode: the previous step's qparams
        Case{"minmax_observer", {16, 33}, {}, {{"delayed", true}}},
        Case{"moving_average_observer",
             {5, 16},
             {{"scope", "channel"}, {"axis", 0}},
             {{"delayed", true}}},
        // per token and per group (a tail group included)
        Case{"minmax_observer", {3, 4, 10}, {{"scope", "token"}}, {}},
        Case{"moving_average_observer", {5, 64}, {{"scope", "token"}, {"signed", true}}, {}},
        Case{
            "minmax_observer", {6, 40}, {{"scope", "group"}, {"axis", -1}, {"group_size", 16}}, {}},
        Case{"moving_average_observer",
             {12, 5},
             {{"scope", "group"}, {"axis", 0}, {"group_size", 4}, {"bits", 4}},
             {{"qscheme", "symmetric"}}}));

// observer -> quantize (s8/u8 codes): fused == unfused, codes, mask and state, over steps.
TEST(FusedQuantize, CodesMaskAndStateBitForBit) {
  for (const Attrs& attrs : {Attrs{}, Attrs{{"signed", true}, {"scope", "channel"}, {"axis", 0}},
                             Attrs{{"scope", "channel"}, {"axis", -1}}}) {
    SCOPED_TRACE(attrs.str());
    auto build = [&](Graph& g) {
      ValueId x = g.input("x", {DType::f32, {8, 40}});
      auto qp = g.apply("moving_average_observer", {x}, attrs);
      auto q = g.apply("quantize", {x, qp[0], qp[1]}, attrs);
      g.set_name(q[0], "q");
      g.set_name(q[1], "mask");
      return g.value(qp[0]).producer;
    };
    Graph plain, fused;
    NodeId obs = build(plain);
    build(fused);
    ASSERT_EQ(optimize(fused, PassOptions{}).at(1).rewrites, 1);
    Executor ep(plain), ef(fused);
    NodeId f = fused.value(fused.at("q")).producer;
    EXPECT_EQ(fused.node(f).op->name, "fused_observe_quantize");
    for (uint64_t step = 0; step < 3; ++step) {
      Tensor x = random_tensor({8, 40}, 7 + step, 1.0 + step);
      auto a = ep.run({{"x", x}}, {plain.at("q"), plain.at("mask")});
      auto b = ef.run({{"x", x}}, {fused.at("q"), fused.at("mask")});
      EXPECT_TRUE(same_bits(a[0], b[0])) << "codes, step " << step;
      EXPECT_TRUE(same_bits(a[1], b[1])) << "mask, step " << step;
      for (size_t i = 0; i < ep.states(obs).size(); ++i)
        EXPECT_TRUE(same_bits(ep.states(obs)[i], ef.states(f)[i])) << "state " << i;
    }
  }
}

// The quantize backward reads the observer's scale: a second reader, so training graphs
// keep the observer and quantize apart.
TEST(FusionLegality, QuantizeBackwardReadingTheScaleBlocksFusion) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  auto qp = g.apply("minmax_observer", {x});
  auto q = g.apply("quantize", {x, qp[0], qp[1]});
  ValueId dq = g.input("dq", {DType::f32, {4, 8}});
  g.apply1("quantize_backward", {dq, q[1], qp[0]}, {{"dx_dtype", "f32"}});
  EXPECT_NE(fusion_blocker(g, g.value(qp[0]).producer, g.value(q[0]).producer), "");
  EXPECT_EQ(optimize(g, PassOptions{}).at(1).rewrites, 0);
}

TEST(FusionLegality, SecondReaderOfQparamsBlocksFusion) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 4}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  g.mark_output(fq[0]);
  ValueId other = g.apply1("mul", {qp[0], qp[0]});  // a second reader of the scale
  g.mark_output(other);
  EXPECT_NE(
      fusion_blocker(g, g.value(qp[0]).producer, g.value(fq[0]).producer).find("another reader"),
      std::string::npos);
  EXPECT_EQ(optimize(g, PassOptions{}).at(1).rewrites, 0);
}

TEST(FusionLegality, QparamsThatAreGraphOutputsBlockFusion) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 4}});
  auto qp = g.apply("minmax_observer", {x});
  g.set_name(qp[1], "zero_point");  // named: the user may fetch it
  g.apply("fake_quantize", {x, qp[0], qp[1]});
  EXPECT_EQ(optimize(g, PassOptions{}).at(1).rewrites, 0);
}

TEST(FusionLegality, DifferentValuesOrRangesBlockFusion) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 4}});
  ValueId x2 = g.apply1("neg", {x});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x2, qp[0], qp[1]});  // quantizes another value
  EXPECT_NE(
      fusion_blocker(g, g.value(qp[0]).producer, g.value(fq[0]).producer).find("different values"),
      std::string::npos);
  auto qp2 = g.apply("minmax_observer", {x}, {{"bits", 8}});
  auto fq2 = g.apply("fake_quantize", {x, qp2[0], qp2[1]}, {{"bits", 7}});
  EXPECT_NE(
      fusion_blocker(g, g.value(qp2[0]).producer, g.value(fq2[0]).producer).find("ranges differ"),
      std::string::npos);
  EXPECT_EQ(optimize(g, PassOptions{}).at(1).rewrites, 0);
}

TEST(FusionSwitch, EnvironmentVariableDisablesThePass) {
  setenv("QG_DISABLE_PASSES", "fuse_observer_quantize", 1);
  PassOptions opts = PassOptions::from_env();
  unsetenv("QG_DISABLE_PASSES");
  EXPECT_FALSE(opts.enabled("fuse_observer_quantize"));
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  auto qp = g.apply("minmax_observer", {x});
  g.apply("fake_quantize", {x, qp[0], qp[1]});
  auto rec = optimize(g, opts);
  EXPECT_FALSE(rec.at(1).ran);
  EXPECT_TRUE(rec.at(0).ran);  // merge_duplicate_nodes, not named
  EXPECT_TRUE(PassOptions{{"all"}}.disabled.count("all"));
  EXPECT_FALSE(PassOptions{{"all"}}.enabled("fuse_observer_quantize"));
}

TEST(FusedNode, FetchingAFusedAwayValueIsAClearError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  optimize(g, PassOptions{});
  Executor exec(g);
  try {
    exec.run({{"x", Tensor::zeros({4}, DType::f32)}}, {fq[0]});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused away"), std::string::npos) << e.what();
  }
}

TEST(FusedNode, CannotBeBuiltByApply) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  EXPECT_THROW(g.apply("fused_observe_quantize", {x}), Error);
}

}  // namespace
}  // namespace qg
