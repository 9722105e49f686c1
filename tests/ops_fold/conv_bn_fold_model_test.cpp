// A conv-bn QAT CNN (int8 per-channel weights, uint8 activations, every pass on) trains,
// freezes its batch norms and keeps its checkpoint keys bit for bit the same with the
// conv_bn_fold_weight node nn::conv_bn builds as with the generic chain it replaced
// (add(running_var, eps) -> sqrt -> div -> reshape -> mul), rebuilt here from the node's
// inputs; and the step graph loses the chain's kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "nn/builder.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "train/optimizer.h"

namespace qg {
namespace {

Tensor normal(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  return Tensor::from_doubles(shape, v, DType::f32);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Replaces the fold node by the chain nn::conv_bn built before, with its node names.
void rebuild_generic_chain(Graph& g, const nn::ConvBnLayer& c) {
  const Node fold = g.node(c.fold_node);
  const ValueId w = fold.inputs[0], gamma = fold.inputs[1], var = fold.inputs[2];
  const Shape ws = g.value(w).type.shape;
  ValueId eps_c = g.constant(Tensor::scalar(c.eps, DType::f32), c.name + ".bn.eps");
  ValueId running_std = g.apply1("sqrt", {g.apply1("add", {var, eps_c}, {}, c.name + ".var_eps")},
                                 {}, c.name + ".running_std");
  ValueId scale_factor = g.apply1("div", {gamma, running_std}, {}, c.name + ".scale_factor");
  ValueId sf_w =
      g.apply1("reshape", {scale_factor}, {{"shape", Shape{ws[0], 1, 1, 1}}}, c.name + ".sf_w");
  ValueId w_fold = g.apply1("mul", {w, sf_w}, {}, c.name + ".weight_fold");
  const ValueId to[] = {w_fold, scale_factor};
  for (int k = 0; k < 2; ++k)
    for (NodeId reader : g.consumers(fold.outputs[k])) {
      const Node& n = g.node(reader);
      for (size_t slot = 0; slot < n.inputs.size(); ++slot)
        if (n.inputs[slot] == fold.outputs[k])
          g.replace_input(reader, static_cast<int>(slot), to[k]);
    }
  g.remove_node(c.fold_node);
}

struct Cnn {
  Graph g;
  std::vector<NodeId> updates;
  std::vector<nn::ConvBnLayer> blocks;
};

void build_cnn(Cnn& m, bool generic) {
  nn::Builder b(m.g, nn::QConfig::w8a8(), 3);
  ValueId x = m.g.input("x", {DType::f32, {4, 3, 8, 8}});
  ValueId labels = m.g.input("labels", {DType::i64, {4}});
  ValueId h = b.quant_input(x);
  for (int i = 0; i < 2; ++i)
    h = b.conv_bn(h, i == 0 ? 3 : 6, 6, 3, "block" + std::to_string(i), 1, 1, /*relu=*/true);
  ValueId logits = b.linear(b.global_avg_pool(h, "gap"), 5, "head", false, true);
  ValueId loss = b.cross_entropy(logits, labels);
  m.g.set_name(loss, "loss");
  m.blocks = b.conv_bn_layers();
  if (generic)
    for (const nn::ConvBnLayer& c : m.blocks) rebuild_generic_chain(m.g, c);
  m.updates = nn::add_optimizer(m.g, loss, b.parameters(), {"sgd", 0.05, 0.0});
  optimize(m.g, PassOptions{});
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

// Nodes that launch work: live, not sources, not views (reshape).
int kernel_nodes(const Graph& g) {
  int n = 0;
  for (NodeId id : g.topological_order())
    n += !g.node(id).op->is_source && !g.node(id).op->aliases_input;
  return n;
}

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

TEST(ConvBnFoldModel, QatCnnTrainsFreezesAndCheckpointsIdentically) {
  Cnn generic, op;
  build_cnn(generic, true);
  build_cnn(op, false);
  EXPECT_EQ(count_op(op.g, "conv_bn_fold_weight"), 2);
  EXPECT_EQ(count_op(op.g, "conv_bn_fold_weight_backward"), 2);
  EXPECT_EQ(count_op(op.g, "sqrt") + count_op(op.g, "div"), 0);
  EXPECT_EQ(count_op(generic.g, "conv_bn_fold_weight"), 0);
  // Per block: forward add, sqrt, div, mul -> the fold; backward mul (dw), mul and sum_to
  // (the scale factor's share), the accumulating add, div (dgamma) -> the fold's backward.
  EXPECT_EQ(kernel_nodes(generic.g) - kernel_nodes(op.g), 2 * ((4 - 1) + (5 - 1)));
  Executor eg(generic.g), eo(op.g);
  Tensor labels = Tensor::empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) labels.data<int64_t>()[i] = (i * 3) % 5;
  for (int step = 0; step < 5; ++step) {
    if (step == 3)  // freeze_bn_stats, through the ids the builder recorded
      for (size_t k = 0; k < op.blocks.size(); ++k) {
        eg.state(live_node(generic.g, generic.blocks[k].bn_node), "frozen").data<float>()[0] = 1;
        eo.state(live_node(op.g, op.blocks[k].bn_node), "frozen").data<float>()[0] = 1;
      }
    Executor::Feeds feeds = {{"x", normal({4, 3, 8, 8}, 50 + step)}, {"labels", labels}};
    Tensor a = eg.run(feeds, {generic.g.at("loss")}, generic.updates)[0];
    Tensor b = eo.run(feeds, {op.g.at("loss")}, op.updates)[0];
    EXPECT_TRUE(same_bits(a, b)) << "loss at step " << step;
  }
  // Parameters (weights, gamma, beta), running statistics, observer and optimizer states:
  // the same keys and bits, so checkpoints load across the two.
  const auto sg = named_states(generic.g, eg), so = named_states(op.g, eo);
  ASSERT_EQ(sg.size(), so.size());
  for (const auto& [key, t] : sg) {
    ASSERT_EQ(so.count(key), 1u) << key << " missing from the fold-op graph's states";
    EXPECT_TRUE(same_bits(t, so.at(key))) << key;
  }
  for (const char* key : {"state/block1.weight/value", "state/block1.bn.weight/value",
                          "state/block1.bn.running_var/value", "state/block1.bn/frozen"})
    EXPECT_EQ(so.count(key), 1u) << key;
}

}  // namespace
}  // namespace qg
