// The fuse_channel_div_batch_norm pass (a folded conv-bn block's channel_div -> batch_norm and
// batch_norm_backward -> channel_div_backward, each made one node): the fused graph equals
// the unfused one bit for bit (y, saved statistics, running statistics, every gradient) in
// training, eval and frozen modes, f32 and f64, at shapes with short planes (S < 128), long
// planes, S = 1 and odd sizes; the pass fires exactly where it may; and a conv-bn QAT model
// trains, freezes its batch norms and keeps its checkpoint keys identically with and without
// the pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "autograd/grad.h"
#include "nn/builder.h"
#include "ops/fused/channel_div_bn/channel_div_bn.h"
#include "ops/fused/channel_div_bn/channel_div_bn_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "train/optimizer.h"

namespace qg {
namespace {

const char kPass[] = "fuse_channel_div_batch_norm";

Tensor normal(const Shape& shape, DType dtype, uint64_t seed, double mean, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(mean, sd);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  if (v.size() >= 8) {
    v[1] = -0.0;
    v[v.size() - 1] = 0.0;
  }
  return Tensor::from_doubles(shape, v, dtype);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

int rewrites_of(const std::vector<PassRecord>& records) {
  for (const PassRecord& r : records)
    if (r.name == kPass) return r.rewrites;
  ADD_FAILURE() << "no record of " << kPass;
  return -1;
}

// q = channel_div(x, s); y = batch_norm(q, gamma, beta, running stats); loss = sum(y * w);
// gradients of x, s, gamma and beta.
struct Block {
  Graph g;
  NodeId bn = -1;
};

void build_block(Block& b, const Shape& shape, DType t) {
  const int64_t c = shape[1];
  ValueId x = b.g.input("x", {t, shape});
  ValueId s = b.g.input("s", {t, {c}});
  ValueId gamma = b.g.input("gamma", {t, {c}});
  ValueId beta = b.g.input("beta", {t, {c}});
  ValueId w = b.g.input("w", {t, shape});
  ValueId rm = b.g.parameter("rm", normal({c}, t, 5, 0.0, 0.5));
  ValueId rv = b.g.parameter("rv", normal({c}, t, 6, 2.0, 0.3));
  ValueId q = b.g.apply1("channel_div", {x, s}, {}, "blk.unscale");
  auto bn = b.g.apply("batch_norm", {q, gamma, beta, rm, rv}, {{"momentum", 0.1}, {"eps", 1e-5}},
                      "blk.bn");
  b.bn = b.g.value(bn[0]).producer;
  b.g.set_name(bn[0], "y");
  b.g.set_name(bn[1], "save_mean");
  b.g.set_name(bn[2], "save_invstd");
  ValueId loss = b.g.apply1("sum", {b.g.apply1("mul", {bn[0], w})});
  auto grads = grad(b.g, loss, {x, s, gamma, beta});
  const char* names[] = {"dx", "ds", "dgamma", "dbeta"};
  for (int i = 0; i < 4; ++i) b.g.set_name(grads[i], names[i]);
}

Executor::Feeds block_feeds(const Shape& shape, DType t, uint64_t seed) {
  const Shape c{shape[1]};
  Tensor s = normal(c, t, seed + 1, 1.0, 0.4);
  return {{"x", normal(shape, t, seed, 0.3, 2.0)},
          {"s", s},
          {"gamma", normal(c, t, seed + 2, 1.0, 0.2)},
          {"beta", normal(c, t, seed + 3, 0, 1)},
          {"w", normal(shape, t, seed + 4, 0.0, 1.0)}};
}

enum class Mode { training, eval, frozen };

struct Case {
  Shape shape;
  DType dtype;
  Mode mode;
};

void PrintTo(const Case& c, std::ostream* os) {
  const char* modes[] = {"training", "eval", "frozen"};
  *os << shape_str(c.shape) << " " << dtype_name(c.dtype) << " " << modes[static_cast<int>(c.mode)];
}

class ChannelDivBnFusion : public ::testing::TestWithParam<Case> {};

TEST_P(ChannelDivBnFusion, FusedGraphEqualsUnfusedBitForBit) {
  const Case& k = GetParam();
  Block plain, fused;
  build_block(plain, k.shape, k.dtype);
  build_block(fused, k.shape, k.dtype);
  EXPECT_EQ(rewrites_of(optimize(plain.g, PassOptions{{kPass}})), 0);
  EXPECT_EQ(rewrites_of(optimize(fused.g, PassOptions{})), 1);
  EXPECT_EQ(count_nodes(fused.g, "channel_div"), 0);
  EXPECT_EQ(count_nodes(fused.g, "batch_norm"), 0);
  EXPECT_EQ(count_nodes(fused.g, "batch_norm_backward"), 0);
  EXPECT_EQ(count_nodes(fused.g, "channel_div_backward"), 0);
  EXPECT_EQ(count_nodes(fused.g, "fused_channel_div_batch_norm"), 1);
  EXPECT_EQ(count_nodes(fused.g, "fused_channel_div_batch_norm_backward"), 1);
  const NodeId fused_bn = live_node(fused.g, fused.bn);
  EXPECT_EQ(fused.g.node(fused_bn).name, "blk.bn");
  EXPECT_EQ(live_node(plain.g, plain.bn), plain.bn);

  Executor ep(plain.g), ef(fused.g);
  ep.set_training(k.mode != Mode::eval);
  ef.set_training(k.mode != Mode::eval);
  if (k.mode == Mode::frozen) {
    ep.state(plain.bn, "frozen").data<float>()[0] = 1.0f;
    ef.state(fused_bn, "frozen").data<float>()[0] = 1.0f;
  }
  const std::vector<std::string> fetch = {"y",  "save_mean", "save_invstd", "dx",
                                          "ds", "dgamma",    "dbeta"};
  for (uint64_t step = 0; step < 2; ++step) {  // the second step starts from updated stats
    const Executor::Feeds feeds = block_feeds(k.shape, k.dtype, 100 * step + 7);
    auto a = ep.run_named(feeds, fetch);
    auto b = ef.run_named(feeds, fetch);
    for (const std::string& name : fetch)
      EXPECT_TRUE(same_bits(a.at(name), b.at(name))) << name << " at step " << step;
    for (const char* p : {"rm", "rv"})
      EXPECT_TRUE(same_bits(ep.parameter(p), ef.parameter(p))) << p << " at step " << step;
  }
  // Training moves the running statistics; eval and frozen keep them.
  Block fresh;
  build_block(fresh, k.shape, k.dtype);
  Executor e0(fresh.g);
  EXPECT_EQ(same_bits(ef.parameter("rm"), e0.parameter("rm")), k.mode != Mode::training);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // S = 35 and S = 1 (the flat per-element walk, S < 128), S = 130 and 256 (per plane); N*S
  // a multiple of no block size.
  const std::vector<Shape> shapes = {{4, 3, 5, 7}, {7, 5}, {3, 2, 130}, {2, 3, 16, 16}};
  for (DType t : {DType::f32, DType::f64})
    for (Mode m : {Mode::training, Mode::eval, Mode::frozen})
      for (const Shape& s : shapes) out.push_back({s, t, m});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, ChannelDivBnFusion, ::testing::ValuesIn(cases()));

// A forward without the backward pair (an inference graph): the forward alone fuses.
TEST(ChannelDivBnFusionLegality, ForwardOnlyGraphFusesTheForward) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  ValueId p = g.input("p", {DType::f32, {3}});
  ValueId q = g.apply1("channel_div", {x, s});
  g.mark_output(g.apply("batch_norm", {q, p, p, p, p})[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 1);
  EXPECT_EQ(count_nodes(g, "fused_channel_div_batch_norm"), 1);
  EXPECT_EQ(count_nodes(g, "channel_div"), 0);
}

// Every reader of the quotient must go away with the rewrite, else nothing is fused.
TEST(ChannelDivBnFusionLegality, QuotientWithAnotherReaderStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  ValueId p = g.input("p", {DType::f32, {3}});
  ValueId q = g.apply1("channel_div", {x, s});
  ValueId y = g.apply("batch_norm", {q, p, p, p, p})[0];
  ValueId loss = g.apply1("sum", {g.apply1("add", {y, g.apply1("relu", {q})})});
  g.mark_output(grad(g, loss, {x})[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 0);
  EXPECT_EQ(count_nodes(g, "channel_div"), 1);
  EXPECT_NE(channel_div_fusion_blocker(g, g.value(q).producer), "");
}

TEST(ChannelDivBnFusionLegality, NamedQuotientStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  ValueId p = g.input("p", {DType::f32, {3}});
  ValueId q = g.apply1("channel_div", {x, s});
  g.set_name(q, "q");
  g.mark_output(g.apply("batch_norm", {q, p, p, p, p})[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 0);
  EXPECT_NE(channel_div_fusion_blocker(g, g.value(q).producer).find("graph output"),
            std::string::npos);
}

// Only gamma's gradient: batch_norm_backward reads the quotient but no channel_div_backward
// does, so the quotient must stay (and with it the unfused forward).
TEST(ChannelDivBnFusionLegality, BackwardWithoutChannelDivBackwardStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  ValueId gamma = g.input("gamma", {DType::f32, {3}});
  ValueId p = g.input("p", {DType::f32, {3}});
  ValueId q = g.apply1("channel_div", {x, s});
  ValueId loss = g.apply1("sum", {g.apply("batch_norm", {q, gamma, p, p, p})[0]});
  g.mark_output(grad(g, loss, {gamma})[0]);
  ASSERT_EQ(count_nodes(g, "batch_norm_backward"), 1);
  ASSERT_EQ(count_nodes(g, "channel_div_backward"), 0);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 0);
  EXPECT_NE(channel_div_fusion_blocker(g, g.value(q).producer).find("only one"), std::string::npos);
}

// No batch norm reads the quotient: nothing to fuse.
TEST(ChannelDivBnFusionLegality, ChannelDivWithoutBatchNormStaysUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  g.mark_output(g.apply1("relu", {g.apply1("channel_div", {x, s})}));
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 0);
}

// Two batch norms reading one quotient: one fused node could not replace both.
TEST(ChannelDivBnFusionLegality, TwoBatchNormReadersStayUnfused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId s = g.input("s", {DType::f32, {3}});
  ValueId p = g.input("p", {DType::f32, {3}});
  ValueId q = g.apply1("channel_div", {x, s});
  g.mark_output(g.apply("batch_norm", {q, p, p, p, p})[0]);
  g.mark_output(g.apply("batch_norm", {q, p, p, p, p})[0]);
  EXPECT_EQ(rewrites_of(optimize(g, PassOptions{})), 0);
  EXPECT_NE(channel_div_fusion_blocker(g, g.value(q).producer).find("two batch_norm"),
            std::string::npos);
}

// live_node of a node a pass removed without fusing it anywhere: an error naming the node.
TEST(ChannelDivBnFusionLegality, LiveNodeOfARemovedUnfusedNodeIsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId r = g.apply1("relu", {x}, {}, "lonely");
  const NodeId id = g.value(r).producer;
  g.remove_node(id);
  try {
    live_node(g, id);
    ADD_FAILURE() << "expected qg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
}

TEST(ChannelDivBnFusionLegality, FusedNodesCannotBeAppliedDirectly) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId v = g.input("v", {DType::f32, {3}});
  ValueId u = g.input("u", {DType::f32, {1}});
  for (const auto& [op, inputs] : std::vector<std::pair<std::string, std::vector<ValueId>>>{
           {"fused_channel_div_batch_norm", {x, v, v, v, v, v}},
           {"fused_channel_div_batch_norm_backward", {x, x, v, v, v, v, u}}}) {
    try {
      g.apply(op, inputs);
      ADD_FAILURE() << op << ": expected qg::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("pass"), std::string::npos) << e.what();
    }
  }
}

// The type checks the pass builds the nodes with: each bad input is an error naming the op.
TEST(ChannelDivBnFusionLegality, BadTypesAreNamedErrors) {
  const TensorType x{DType::f32, {2, 3, 4}}, v{DType::f32, {3}}, u{DType::f32, {1}};
  const TensorType v64{DType::f64, {3}}, v4{DType::f32, {4}};
  auto fails = [](auto fn, const std::vector<TensorType>& in, const std::string& op,
                  const std::string& what) {
    try {
      fn(in);
      ADD_FAILURE() << what << ": expected qg::Error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  auto fwd = fused_channel_div_batch_norm_types;
  auto back = fused_channel_div_batch_norm_backward_types;
  const std::string f = "fused_channel_div_batch_norm", b = f + "_backward";
  EXPECT_EQ(fwd({x, v, v, v, v, v}).size(), 4u);
  EXPECT_EQ(back({x, x, v, v, v, v, u}).size(), 4u);
  fails(fwd, {x, v, v, v, v}, f, "expects 6 inputs");
  fails(fwd, {{DType::i32, {2, 3}}, v, v, v, v, v}, f, "f32 or f64");
  fails(fwd, {{DType::f32, {3}}, v, v, v, v, v}, f, "rank >= 2");
  fails(fwd, {x, v4, v, v, v, v}, f, "input 1");
  fails(fwd, {x, v, v, v, v, v64}, f, "input 5");
  fails(back, {x, x, v, v, v, v}, b, "expects 7 inputs");
  fails(back, {{DType::f32, {2, 3, 5}}, x, v, v, v, v, u}, b, "dy");
  fails(back, {x, x, v, v64, v, v, u}, b, "input 3");
  fails(back, {x, x, v, v, v, v, v}, b, "used_batch_stats");
}

// A small conv-bn QAT CNN (int8 weights, uint8 activations): SGD steps, then frozen batch
// norms, with and without the pass (every other pass on in both), give the same losses,
// parameters and running statistics bit for bit, and the same name-keyed state (what a
// checkpoint saves), so checkpoints load across the two.
struct Cnn {
  Graph g;
  ValueId loss = kNoValue;
  std::vector<NodeId> updates;
  std::vector<nn::ConvBnLayer> blocks;
};

void build_cnn(Cnn& m) {
  nn::Builder b(m.g, nn::QConfig::w8a8(), 3);
  ValueId x = m.g.input("x", {DType::f32, {4, 3, 8, 8}});
  ValueId labels = m.g.input("labels", {DType::i64, {4}});
  ValueId h = b.quant_input(x);
  for (int i = 0; i < 2; ++i)
    h = b.conv_bn(h, i == 0 ? 3 : 6, 6, 3, "block" + std::to_string(i), 1, 1, /*relu=*/true);
  ValueId logits = b.linear(b.global_avg_pool(h, "gap"), 5, "head", false, true);
  m.loss = b.cross_entropy(logits, labels);
  m.g.set_name(m.loss, "loss");
  m.updates = nn::add_optimizer(m.g, m.loss, b.parameters(), {"sgd", 0.05, 0.0});
  m.blocks = b.conv_bn_layers();
}

std::map<std::string, Tensor> named_states(const Graph& g, Executor& e) {
  std::map<std::string, Tensor> out;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.dead || n.states.empty() || n.op->name == "constant") continue;
    for (size_t i = 0; i < n.states.size(); ++i)
      out["state/" + n.name + "/" + n.states[i].name] = e.states(id).at(i);
  }
  return out;
}

TEST(ChannelDivBnFusionModel, ConvBnQatTrainsFreezesAndCheckpointsIdentically) {
  Cnn plain, fused;
  build_cnn(plain);
  build_cnn(fused);
  EXPECT_EQ(rewrites_of(optimize(plain.g, PassOptions{{kPass}})), 0);
  EXPECT_EQ(rewrites_of(optimize(fused.g, PassOptions{})), 2);
  EXPECT_EQ(count_nodes(fused.g, "channel_div"), 0);
  EXPECT_EQ(count_nodes(plain.g, "channel_div"), 2);
  Executor ep(plain.g), ef(fused.g);
  Tensor labels = Tensor::empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) labels.data<int64_t>()[i] = (i * 3) % 5;
  for (int step = 0; step < 5; ++step) {
    if (step == 3)  // freeze_bn_stats, through the ids the builder recorded
      for (size_t k = 0; k < plain.blocks.size(); ++k) {
        ep.state(live_node(plain.g, plain.blocks[k].bn_node), "frozen").data<float>()[0] = 1;
        ef.state(live_node(fused.g, fused.blocks[k].bn_node), "frozen").data<float>()[0] = 1;
      }
    Executor::Feeds feeds = {{"x", normal({4, 3, 8, 8}, DType::f32, 50 + step, 0.0, 1.0)},
                             {"labels", labels}};
    Tensor a = ep.run(feeds, {plain.g.at("loss")}, plain.updates)[0];
    Tensor b = ef.run(feeds, {fused.g.at("loss")}, fused.updates)[0];
    EXPECT_TRUE(same_bits(a, b)) << "loss at step " << step;
  }
  const auto sa = named_states(plain.g, ep), sb = named_states(fused.g, ef);
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) {
    ASSERT_EQ(sb.count(key), 1u) << key << " missing from the fused graph's states";
    EXPECT_TRUE(same_bits(t, sb.at(key))) << key;
  }
  EXPECT_EQ(sb.at("state/block1.bn/frozen").data<float>()[0], 1.0f);
  // Loading the unfused graph's states into the fused one (a checkpoint round trip) and
  // stepping both again keeps them equal.
  for (NodeId id = 0; id < fused.g.num_nodes(); ++id) {
    const Node& n = fused.g.node(id);
    if (n.dead || n.states.empty() || n.op->name == "constant") continue;
    for (size_t i = 0; i < n.states.size(); ++i)
      ef.state(id, n.states[i].name) = sa.at("state/" + n.name + "/" + n.states[i].name).clone();
  }
  Executor::Feeds feeds = {{"x", normal({4, 3, 8, 8}, DType::f32, 99, 0.0, 1.0)},
                           {"labels", labels}};
  EXPECT_TRUE(same_bits(ep.run(feeds, {plain.g.at("loss")}, plain.updates)[0],
                        ef.run(feeds, {fused.g.at("loss")}, fused.updates)[0]));
}

}  // namespace
}  // namespace qg
