// The fuse_ste_optimizer and fuse_ste_chain passes (ops/fused/ste_optimizer, ops/fused/ste_chain)
// on the CPU: a fake-quantized weight trained by sgd (with and without momentum, weight decay) or
// adam ends bit-identical fused and unfused (parameter and optimizer state after several steps, f32
// and f64, per-tensor and per-channel masks, NaN / infinities / signed zeros in the gradient); a
// value quantized twice gets the same gradient from the two-mask node (f32, f64, bf16, f16); the
// passes leave alone what they must; and the transformer QAT step of `qat steps` trains identically
// with and without them.
#include <gtest/gtest.h>

#include "ops/fused/ste_optimizer/ste_optimizer_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::special_data;
using testing::WeightCase;
using testing::WeightStep;

const PassOptions kUnfused{{"fuse_ste_optimizer", "fuse_ste_chain"}};

class SteOptimizerFusion : public ::testing::TestWithParam<WeightCase> {};

TEST_P(SteOptimizerFusion, ParamsAndStatesEqualUnfusedBitForBit) {
  const WeightCase& c = GetParam();
  WeightStep plain, fused;
  testing::build_weight_step(plain, c);
  testing::build_weight_step(fused, c);
  optimize(plain.g, kUnfused);
  auto records = optimize(fused.g, PassOptions{});
  ASSERT_EQ(records.at(3).name, "fuse_ste_optimizer");
  EXPECT_EQ(records.at(3).rewrites, 1);
  EXPECT_EQ(count_nodes(fused.g, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(plain.g, "ste_backward"), 1);
  // The step kept its id (the caller's run target), its name and its control dependency on
  // the weight's fake-quantize (the in-place update runs after the forward read w).
  const Node& step = fused.g.node(fused.step);
  ASSERT_EQ(step.op->name, "fused_ste_optimizer");
  EXPECT_EQ(step.name, plain.g.node(plain.step).name);
  bool ordered_after_fq = false;
  const BoostGraph& bg = fused.g.boost_graph();
  for (auto [e, end] = boost::in_edges(fused.step, bg); e != end; ++e)
    ordered_after_fq |= bg[*e].value == kNoValue && bg[boost::source(*e, bg)].name == "w.fq";
  EXPECT_TRUE(ordered_after_fq);

  Executor ep(plain.g), ef(fused.g);
  const Tensor init = ep.parameter("w").clone();
  for (uint64_t i = 0; i < 4; ++i) {
    Executor::Feeds feeds = {{"x", special_data(c.shape, c.dtype, 30 + i, 3.0)}};
    Tensor lp = ep.run(feeds, {plain.loss}, {plain.step})[0];
    Tensor lf = ef.run(feeds, {fused.loss}, {fused.step})[0];
    EXPECT_EQ(first_difference(lp, lf), "") << "loss, step " << i;
    EXPECT_EQ(first_difference(ep.parameter("w"), ef.parameter("w")), "") << "step " << i;
    const auto& sp = ep.states(plain.step);
    const auto& sf = ef.states(fused.step);
    ASSERT_EQ(sp.size(), sf.size());
    for (size_t k = 0; k < sp.size(); ++k)
      EXPECT_EQ(first_difference(sp[k], sf[k]), "") << "state " << k << ", step " << i;
  }
  // The steps ran (a dead or skipped target would leave w as it was).
  EXPECT_NE(first_difference(init, ef.parameter("w")), "");
}

std::vector<WeightCase> weight_cases() {
  std::vector<WeightCase> out;
  nn::OptimizerConfig sgd_plain{"sgd", 0.05, 0.0};
  nn::OptimizerConfig sgd_momentum{"sgd", 0.05, 0.9};
  sgd_momentum.weight_decay = 0.01;
  // Momentum without weight decay stores the masked-off gradient's +0 in the buffer as is:
  // a -0 there (a select of the wrong zero) shows in the state.
  nn::OptimizerConfig sgd_momentum_only{"sgd", 0.05, 0.9};
  nn::OptimizerConfig adam{"adam", 0.01};
  adam.weight_decay = 0.01;
  for (DType t : {DType::f32, DType::f64})
    for (bool per_channel : {false, true})
      for (const auto& o : {sgd_plain, sgd_momentum, sgd_momentum_only, adam})
        out.push_back({t, per_channel, o, Shape{7, 9}});            // 63: a partial last mask byte
  out.push_back({DType::f32, true, sgd_momentum, Shape{64, 300}});  // 2 thread-pool chunks
  return out;
}

INSTANTIATE_TEST_SUITE_P(Steps, SteOptimizerFusion, ::testing::ValuesIn(weight_cases()));

struct ChainCase {
  DType dtype;
  bool per_channel;
  Shape shape;
};

void PrintTo(const ChainCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << (c.per_channel ? " per-channel" : " per-tensor")
      << " n=" << shape_numel(c.shape);
}

class SteChainFusion : public ::testing::TestWithParam<ChainCase> {};

TEST_P(SteChainFusion, TwoMaskNodeEqualsThePairBitForBit) {
  const ChainCase& c = GetParam();
  Graph plain, fused;
  testing::build_double_quantize(plain, c.dtype, c.shape, c.per_channel);
  testing::build_double_quantize(fused, c.dtype, c.shape, c.per_channel);
  optimize(plain, kUnfused);
  auto records = optimize(fused, PassOptions{});
  ASSERT_EQ(records.at(4).name, "fuse_ste_chain");
  EXPECT_EQ(records.at(4).rewrites, 1);
  EXPECT_EQ(count_nodes(fused, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(fused, "fused_ste_chain"), 1);
  EXPECT_EQ(count_nodes(plain, "ste_backward"), 2);
  Executor ep(plain), ef(fused);
  for (uint64_t i = 0; i < 2; ++i) {
    // x spreads over both quantizers' ranges, so every mask-bit combination occurs.
    Executor::Feeds feeds = {{"x", special_data(c.shape, c.dtype, 50 + i, 2.0)},
                             {"w", special_data(c.shape, c.dtype, 60 + i, 1.0)}};
    Tensor a = ep.run(feeds, {plain.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.at("dx")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "step " << i;
  }
}

std::vector<ChainCase> chain_cases() {
  std::vector<ChainCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool per_channel : {false, true}) out.push_back({t, per_channel, Shape{5, 13}});
  out.push_back({DType::f32, true, Shape{3, 11000}});  // 2 chunks, several stack blocks
  return out;
}

INSTANTIATE_TEST_SUITE_P(Masks, SteChainFusion, ::testing::ValuesIn(chain_cases()));

// The weight's masked gradient with another use must survive: returned to the user (a graph
// output), clipped (read by a mul, not the step) or logged (read by the step and a sum).
TEST(SteOptimizerFusionLegality, MaskedGradientWithAnotherUseStaysUnfused) {
  for (const std::string use : {"output", "clipped", "logged"}) {
    Graph g;
    ValueId w = g.parameter("w", special_data({4, 8}, DType::f32, 1));
    ValueId x = g.input("x", {DType::f32, {4, 8}});
    ValueId s = g.constant(Tensor::from_doubles({1}, {0.01}, DType::f32));
    ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
    auto fq = g.apply("fake_quantize", {w, s, z}, {{"signed", true}});
    ValueId loss = g.apply1("sum", {g.apply1("mul", {fq[0], x})});
    ValueId dw = grad(g, loss, {w})[0];
    ValueId applied = dw;
    if (use == "output") g.mark_output(dw);
    if (use == "clipped")
      applied = g.apply1("mul", {dw, g.constant(Tensor::from_doubles({1}, {0.5}, DType::f32))});
    if (use == "logged") g.mark_output(g.apply1("sum", {dw}));
    g.apply("sgd", {w, applied}, {{"lr", 0.1}});
    auto records = optimize(g, PassOptions{});
    EXPECT_EQ(records.at(3).rewrites, 0) << use;
    EXPECT_EQ(count_nodes(g, "ste_backward"), 1) << use;
    EXPECT_EQ(count_nodes(g, "fused_ste_optimizer"), 0) << use;
    const NodeId ste = g.value(dw).producer;
    for (NodeId reader : g.consumers(dw))
      EXPECT_NE(ste_optimizer_fusion_blocker(g, ste, reader), "") << use;
  }
}

// A named masked gradient (a run may fetch it by name) stays, for both passes.
TEST(SteOptimizerFusionLegality, NamedMaskedGradientStaysUnfused) {
  WeightCase c;
  c.dtype = DType::f32;
  c.per_channel = false;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.0;
  c.shape = {4, 8};
  WeightStep s;
  testing::build_weight_step(s, c);
  const ValueId dw = s.g.node(s.step).inputs.at(1);
  s.g.set_name(dw, "dw");
  EXPECT_EQ(optimize(s.g, PassOptions{}).at(3).rewrites, 0);
  EXPECT_EQ(s.g.node(s.step).op->name, "sgd");

  Graph g;
  testing::build_double_quantize(g, DType::f32, {4, 8}, false);
  const NodeId second = g.value(g.at("dx")).producer;
  const ValueId t = g.node(second).inputs.at(0);
  g.set_name(t, "t");
  EXPECT_EQ(optimize(g, PassOptions{}).at(4).rewrites, 0);
  EXPECT_EQ(count_nodes(g, "ste_backward"), 2);
}

// The first mask's output also read elsewhere (the transformer's second residual: its masked
// gradient feeds both the next ste_backward and a gradient accumulation): no chain fusion.
TEST(SteChainFusionLegality, FirstMaskedGradientWithAnotherReaderStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId s = g.constant(Tensor::from_doubles({1}, {0.02}, DType::f32));
  ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
  auto q1 = g.apply("fake_quantize", {x, s, z}, {{"signed", true}});
  auto q2 = g.apply("fake_quantize", {q1[0], s, z}, {{"signed", true}});
  // q1 is used twice: through q2 and directly, so its gradient sums two paths.
  ValueId loss = g.apply1("sum", {g.apply1("mul", {q2[0], q1[0]})});
  g.mark_output(grad(g, loss, {x})[0]);
  auto records = optimize(g, PassOptions{});
  EXPECT_EQ(records.at(4).rewrites, 0);
  EXPECT_EQ(count_nodes(g, "fused_ste_chain"), 0);
}

// Three quantizers in a row: the passes pair the first two and leave the third alone (pairs
// never overlap), and the gradient is still the unfused one.
TEST(SteChainFusionLegality, ThreeInARowFuseOnePair) {
  auto build = [](Graph& g) {
    ValueId x = g.input("x", {DType::f32, {6, 7}});
    ValueId s = g.constant(Tensor::from_doubles({1}, {0.02}, DType::f32));
    ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
    ValueId h = x;
    for (int i = 0; i < 3; ++i) h = g.apply("fake_quantize", {h, s, z}, {{"signed", true}})[0];
    ValueId dx = grad(g, g.apply1("sum", {g.apply1("mul", {h, h})}), {x})[0];
    g.set_name(dx, "dx");
  };
  Graph plain, fused;
  build(plain);
  build(fused);
  optimize(plain, kUnfused);
  EXPECT_EQ(optimize(fused, PassOptions{}).at(4).rewrites, 1);
  EXPECT_EQ(count_nodes(fused, "ste_backward"), 1);
  Executor::Feeds feeds = {{"x", special_data({6, 7}, DType::f32, 70, 2.0)}};
  Tensor a = Executor(plain).run(feeds, {plain.at("dx")})[0];
  Tensor b = Executor(fused).run(feeds, {fused.at("dx")})[0];
  EXPECT_EQ(first_difference(a, b), "");
}

// `qat steps`' transformer QAT step: which ste_backward nodes the passes fuse, and the same
// losses and parameters after three SGD steps with and without them.
TEST(SteOptimizerFusionTransformer, TrainsIdenticallyWithAndWithoutThePasses) {
  testing::TransformerStep plain, fused;
  testing::build_transformer_step(plain);
  testing::build_transformer_step(fused);
  optimize(plain.g, PassOptions{{"fuse_ste_optimizer", "fuse_ste_chain", "fuse_ste_producer"}});
  auto records = optimize(fused.g, PassOptions{});
  // 18 ste_backward nodes after fuse_ste_backward (one went into the MLP's GELU): the 7
  // weight quantizers' feed their sgd steps; one of the two ste_backward -> ste_backward
  // pairs has a single reader in between (the other's feeds a gradient sum too); then
  // fuse_ste_producer takes 4 of the other 9 (q, k, v into the head-merge permutes, ln1's into
  // the gradient sum: tests/passes/ste_producer_fusion_test.cpp).
  EXPECT_EQ(count_nodes(plain.g, "ste_backward"), 18);
  EXPECT_EQ(records.at(3).rewrites, 7);
  EXPECT_EQ(records.at(4).rewrites, 1);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_optimizer"), 7);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_chain"), 1);
  EXPECT_EQ(count_nodes(fused.g, "ste_backward"), 5);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_producer"), 4);
  EXPECT_EQ(count_nodes(fused.g, "sgd"), 11);  // biases and layer-norm parameters
  testing::expect_trains_identically(plain, fused, Device::cpu());
}

TEST(SteOptimizerFusionErrors, FusedNodesCannotBeAppliedDirectly) {
  Graph g;
  ValueId w = g.parameter("w", Tensor::zeros({8}, DType::f32));
  ValueId dy = g.input("dy", {DType::f32, {8}});
  ValueId m = g.input("m", {DType::u8, {1}});
  for (const auto& [op, inputs] : std::vector<std::pair<std::string, std::vector<ValueId>>>{
           {"fused_ste_optimizer", {w, dy, m}}, {"fused_ste_chain", {dy, m, m}}}) {
    try {
      g.apply(op, inputs);
      ADD_FAILURE() << "expected qg::Error for " << op;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  }
}

// Kernels check what they rely on: a mask of one bit per element (a hand-built node with a
// 1-byte mask for 16 elements is a qg::Error naming the op, not an out-of-bounds read).
TEST(SteOptimizerFusionErrors, KernelsRejectAMaskOfTheWrongSize) {
  Graph g;
  ValueId w = g.parameter("w", Tensor::zeros({16}, DType::f32));
  ValueId dy = g.input("dy", {DType::f32, {16}});
  ValueId m = g.input("m", {DType::u8, {1}});
  Node step;
  step.op = &OpRegistry::instance().get("sgd");
  step.attrs = resolve_attrs(*step.op, {{"lr", 0.1}});
  Node ste;
  ste.op = &OpRegistry::instance().get("ste_backward");
  Node opt;
  opt.op = &OpRegistry::instance().get("fused_ste_optimizer");
  opt.name = "bad_opt";
  opt.inputs = {w, dy, m};
  opt.attrs = step.attrs;
  opt.states = {{"momentum_buffer", {DType::f32, {16}}, 0.0}, {"step", {DType::i64, {1}}, 0.0}};
  opt.fused_from = {ste, step};
  NodeId opt_id = g.add_raw_node(opt, {});
  Node chain;
  chain.op = &OpRegistry::instance().get("fused_ste_chain");
  chain.name = "bad_chain";
  chain.inputs = {dy, m, m};
  chain.fused_from = {ste, ste};
  ValueId out = g.node(g.add_raw_node(chain, {{DType::f32, {16}}})).outputs[0];
  Executor ex(g);
  Executor::Feeds feeds = {{"dy", Tensor::zeros({16}, DType::f32)},
                           {"m", Tensor::zeros({1}, DType::u8)}};
  for (int which = 0; which < 2; ++which) {
    const std::string op = which == 0 ? "fused_ste_optimizer" : "fused_ste_chain";
    try {
      if (which == 0)
        ex.run(feeds, {}, {opt_id});
      else
        ex.run(feeds, {out});
      ADD_FAILURE() << "expected qg::Error from " << op;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("mask"), std::string::npos) << e.what();
    }
  }
}

TEST(SteOptimizerFusionErrors, RewritingARemovedNodeIsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  NodeId relu = g.value(g.apply1("relu", {x})).producer;
  g.remove_node(relu);
  Node n = g.node(relu);
  EXPECT_THROW(g.rewrite_node(relu, n), Error);
  EXPECT_THROW(g.rewrite_node(12345, n), Error);
}

}  // namespace
}  // namespace qg
