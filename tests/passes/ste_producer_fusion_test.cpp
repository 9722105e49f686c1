// The fuse_ste_producer pass (ops/fused/ste_producer/ste_producer_fusion.cpp) on the CPU: a permute
// or transpose (through reshape views) or a same-shape add feeding an ste_backward becomes one
// fused_ste_producer node whose output equals the unfused graph's bit for bit (f32, f64,
// bf16, f16; NaN, infinities and signed zeros in the data, random mask bytes); the pass leaves
// alone what it must (an intermediate value with a second reader, an output or named one, a
// broadcasting add, another producer); the fused node's kernels reject bad inputs with a
// qg::Error; and the transformer QAT step of `qat steps` trains identically with and without
// the pass.
#include <gtest/gtest.h>

#include <map>

#include "ops/fused/ste_producer/ste_producer_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_producer_graphs.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::original_node;
using testing::ProducerCase;

const PassOptions kUnfused{{"fuse_ste_producer"}};

int producer_rewrites(const std::vector<PassRecord>& records) {
  return testing::pass_rewrites(records, "fuse_ste_producer");
}

class SteProducerFusion : public ::testing::TestWithParam<ProducerCase> {};

TEST_P(SteProducerFusion, FusedNodeEqualsUnfusedGraphBitForBit) {
  const ProducerCase& c = GetParam();
  Graph plain, fused;
  testing::build_producer_ste(plain, c);
  testing::build_producer_ste(fused, c);
  optimize(plain, kUnfused);
  EXPECT_EQ(producer_rewrites(optimize(fused, PassOptions{})), 1);
  EXPECT_EQ(count_nodes(fused, "fused_ste_producer"), 1);
  EXPECT_EQ(count_nodes(fused, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(fused, c.producer), 0);
  EXPECT_EQ(count_nodes(fused, "reshape"), 0);
  EXPECT_EQ(count_nodes(plain, "ste_backward"), 1);
  const Node& node = fused.node(fused.value(fused.at("dx")).producer);
  ASSERT_EQ(node.fused_from.size(), c.views.size() + 2);
  EXPECT_EQ(node.fused_from.front().op->name, c.producer);
  Executor ep(plain), ef(fused);
  for (uint64_t step = 0; step < 2; ++step) {
    const Executor::Feeds feeds = testing::producer_feeds(c, 10 * step + 1);
    Tensor a = ep.run(feeds, {plain.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.at("dx")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "step " << step;
  }
}

std::vector<ProducerCase> all_cases() {
  std::vector<ProducerCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (const ProducerCase& c : testing::producer_cases(t)) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Producers, SteProducerFusion, ::testing::ValuesIn(all_cases()));

// The value a fusion would remove with a second reader, marked as an output, or named, at
// either place in the chain (the producer's output, the reshape view): no fusion, and the
// blocker says why.
TEST(SteProducerFusionLegality, IntermediateWithAnotherUseStaysUnfused) {
  const ProducerCase c{"permute", DType::f32, {2, 3, 4, 8}, {0, 2, 1, 3}, {{2, 4, 24}}};
  for (const std::string use : {"reader", "output", "named"})
    for (bool at_view : {false, true}) {
      Graph g;
      const ValueId p = testing::build_producer_ste(g, c);
      const NodeId ste = g.value(g.at("dx")).producer;
      const ValueId v = at_view ? g.node(ste).inputs.at(0) : p;
      if (use == "reader") g.mark_output(g.apply1("sum", {v}));
      if (use == "output") g.mark_output(v);
      if (use == "named") g.set_name(v, "kept");
      const std::string label = use + (at_view ? " (view)" : " (producer)");
      EXPECT_NE(ste_producer_fusion_blocker(g, ste), "") << label;
      EXPECT_EQ(producer_rewrites(optimize(g, PassOptions{})), 0) << label;
      EXPECT_EQ(count_nodes(g, "ste_backward"), 1) << label;
      EXPECT_EQ(count_nodes(g, "fused_ste_producer"), 0) << label;
    }
}

// A broadcasting add (the kernel reads both operands at the output's index), and producers
// that are not element-wise copies or sums: no fusion.
TEST(SteProducerFusionLegality, BroadcastingAddAndOtherProducersStayUnfused) {
  auto build = [](Graph& g, const std::string& op, const Shape& b_shape) {
    ValueId a = g.input("a", {DType::f32, {4, 8}});
    ValueId b = g.input("b", {DType::f32, b_shape});
    ValueId m = g.input("mask", {DType::u8, {4}});
    g.set_name(g.apply1("ste_backward", {g.apply1(op, {a, b}), m}), "dx");
  };
  for (const auto& [op, b_shape] : std::vector<std::pair<std::string, Shape>>{
           {"add", {8}}, {"add", {4, 1}}, {"mul", {4, 8}}, {"sub", {4, 8}}}) {
    Graph g;
    build(g, op, b_shape);
    EXPECT_NE(ste_producer_fusion_blocker(g, g.value(g.at("dx")).producer), "") << op;
    EXPECT_EQ(producer_rewrites(optimize(g, PassOptions{})), 0) << op;
    EXPECT_EQ(count_nodes(g, "ste_backward"), 1) << op;
  }
  Graph g;
  build(g, "add", {4, 8});
  EXPECT_EQ(ste_producer_fusion_blocker(g, g.value(g.at("dx")).producer), "");
  // The producer is not an ste_backward's: the blocker names the node it was given.
  EXPECT_NE(ste_producer_fusion_blocker(g, g.value(g.at("a")).producer), "");
}

// The transformer QAT step of `qat steps`: the q, k and v fake-quantizers' ste_backward fuse
// into the head-merge permutes, ln1's into the gradient sum (an add); the same losses and
// parameters after three SGD steps with and without the pass.
TEST(SteProducerFusionTransformer, TrainsIdenticallyWithAndWithoutThePass) {
  testing::TransformerStep plain, fused;
  testing::build_transformer_step(plain);
  testing::build_transformer_step(fused);
  optimize(plain.g, kUnfused);
  EXPECT_EQ(producer_rewrites(optimize(fused.g, PassOptions{})), 4);
  EXPECT_EQ(count_nodes(plain.g, "ste_backward"), 9);
  EXPECT_EQ(count_nodes(fused.g, "ste_backward"), 5);
  EXPECT_EQ(count_nodes(fused.g, "fused_ste_producer"), 4);
  int permutes = 0, adds = 0;
  for (NodeId id : fused.g.topological_order()) {
    const Node& n = fused.g.node(id);
    if (n.op->name != "fused_ste_producer") continue;
    permutes += n.fused_from.front().op->name == "permute";
    adds += n.fused_from.front().op->name == "add";
  }
  EXPECT_EQ(permutes, 3);
  EXPECT_EQ(adds, 1);
  testing::expect_trains_identically(plain, fused, Device::cpu());
}

TEST(SteProducerFusionErrors, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  ValueId m = g.input("m", {DType::u8, {1}});
  try {
    g.apply("fused_ste_producer", {a, m, a});
    ADD_FAILURE() << "expected qg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_ste_producer"), std::string::npos) << e.what();
  }
}

// Hand-built fused nodes (the pass never builds these): each bad input is a qg::Error from
// the kernel's check naming the op and what is wrong, not an out-of-bounds access.
TEST(SteProducerFusionErrors, KernelsRejectBadInputs) {
  struct Bad {
    std::string label, expect;
    std::vector<std::string> inputs;  // of the names below
    std::vector<Node> from;
    TensorType out;
  };
  const Node permute = original_node("permute", {{"perm", std::vector<int64_t>{1, 0}}});
  const Node add = original_node("add");
  const Node ste = original_node("ste_backward");
  const Node view = original_node("reshape", {{"shape", Shape{32}}});
  const TensorType out{DType::f32, {8, 4}};
  const std::vector<Bad> cases = {
      {"mask of 3 bytes for 32 elements", "mask", {"a", "mask3"}, {permute, ste}, out},
      {"i8 mask", "mask", {"a", "mask_i8"}, {permute, ste}, out},
      {"broadcasting add", "broadcasting", {"a", "mask", "b_row"}, {add, ste}, out},
      {"b of another dtype", "broadcasting", {"a", "mask", "b_f64"}, {add, ste}, out},
      {"a permute with a b", "takes 2 inputs", {"a", "mask", "a"}, {permute, ste}, out},
      {"an add without b", "takes 3 inputs", {"a", "mask"}, {add, ste}, out},
      {"a mul producer", "not one of", {"a", "mask", "a"}, {original_node("mul"), ste}, out},
      {"no ste_backward last", "must be ste_backward", {"a", "mask"}, {permute, view}, out},
      {"a relu in between",
       "only reshape",
       {"a", "mask"},
       {permute, original_node("relu"), ste},
       out},
      {"one node", "fused_from", {"a", "mask"}, {ste}, out},
      {"a of 32 elements for 36", "a f32", {"a", "mask5"}, {permute, ste}, {DType::f32, {36}}},
      {"f64 output for f32 a", "a f32", {"a", "mask"}, {permute, ste}, {DType::f64, {8, 4}}},
  };
  for (const Bad& c : cases) {
    Graph g;
    std::map<std::string, TensorType> types = {
        {"a", {DType::f32, {4, 8}}},     {"mask", {DType::u8, {4}}},
        {"mask3", {DType::u8, {3}}},     {"mask5", {DType::u8, {5}}},
        {"mask_i8", {DType::i8, {4}}},   {"b_row", {DType::f32, {8}}},
        {"b_f64", {DType::f64, {4, 8}}},
    };
    Executor::Feeds feeds;
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_ste_producer");
    fused.name = "bad";
    for (const std::string& name : c.inputs) {
      if (!feeds.count(name)) {
        g.input(name, types.at(name));
        feeds[name] = Tensor::zeros(types.at(name).shape, types.at(name).dtype);
      }
      fused.inputs.push_back(g.at(name));
    }
    fused.fused_from = c.from;
    // Each original reads a value of input 0's type, as a pass records it: the parts' parsers
    // (softmax's columns, permute's plan) lay their arguments out over it.
    if (!fused.inputs.empty())
      for (Node& n : fused.fused_from) n.inputs = {fused.inputs[0]};
    const ValueId dx = g.node(g.add_raw_node(fused, {c.out})).outputs[0];
    try {
      Executor(g).run(feeds, {dx});
      ADD_FAILURE() << "expected qg::Error for " << c.label;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("fused_ste_producer"), std::string::npos) << c.label << ": " << what;
      EXPECT_NE(what.find(c.expect), std::string::npos) << c.label << ": " << what;
    }
  }
}

}  // namespace
}  // namespace qg
