// The fuse_ste_mul_pair pass (ops/fused/ste_mul_pair/ste_mul_pair_fusion.cpp) on the CPU: an
// ste_backward whose masked gradient (through reshape views or not) is read by exactly two
// muls becomes one fused_ste_mul_pair node whose outputs equal the unfused graph's bit for bit
// (f32, f64, bf16, f16; both operand orders; NaN, infinities and signed zeros in the data;
// random mask bytes; a partial last mask byte); the pass leaves alone what it must (a third
// reader, an output or named masked gradient, a broadcasting mul, a reader that is no mul); the
// fused node's kernel rejects bad inputs with a qg::Error; and the bf16-mixed 8da4w Llama,
// which has one such chain per layer, trains bit for bit as without the pass.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "core/graph_rewrite.h"
#include "ops/fused/ste_mul_pair/ste_mul_pair_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_mul_pair_graphs.h"
#include "tests/common/ste_step_graphs.h"
#include "tests/common/tensor_compare.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::MulPairCase;
using testing::original_node;

const PassOptions kUnfused{{"fuse_ste_mul_pair"}};

int mul_pair_rewrites(const std::vector<PassRecord>& records) {
  return testing::pass_rewrites(records, "fuse_ste_mul_pair");
}

class SteMulPairFusion : public ::testing::TestWithParam<MulPairCase> {};

TEST_P(SteMulPairFusion, FusedNodeEqualsUnfusedGraphBitForBit) {
  const MulPairCase& c = GetParam();
  Graph plain, fused;
  testing::build_mul_pair(plain, c);
  testing::build_mul_pair(fused, c);
  optimize(plain, kUnfused);
  EXPECT_EQ(mul_pair_rewrites(optimize(fused, PassOptions{})), 1);
  EXPECT_EQ(count_nodes(fused, "fused_ste_mul_pair"), 1);
  EXPECT_EQ(count_nodes(fused, "ste_backward"), 0);
  EXPECT_EQ(count_nodes(fused, "mul"), 0);
  EXPECT_EQ(count_nodes(fused, "reshape"), 0);
  EXPECT_EQ(count_nodes(plain, "mul"), 2);
  const Node& node = fused.node(fused.value(fused.at("ya")).producer);
  ASSERT_EQ(node.fused_from.size(), c.reshape ? 4u : 3u);
  EXPECT_EQ(node.attrs.get_int("a_slot"), 0);  // mul(v, a)
  EXPECT_EQ(node.attrs.get_int("b_slot"), 1);  // mul(b, v)
  EXPECT_EQ(fused.value(fused.at("yb")).producer, fused.value(fused.at("ya")).producer);
  Executor ep(plain), ef(fused);
  for (uint32_t seed : {1u, 11u}) {
    const Executor::Feeds feeds = testing::mul_pair_feeds(c, seed);
    const auto a = ep.run(feeds, {plain.at("ya"), plain.at("yb")});
    const auto b = ef.run(feeds, {fused.at("ya"), fused.at("yb")});
    EXPECT_EQ(first_difference(a[0], b[0]), "") << "ya, seed " << seed;
    EXPECT_EQ(first_difference(a[1], b[1]), "") << "yb, seed " << seed;
  }
}

std::vector<MulPairCase> all_cases() {
  std::vector<MulPairCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool reshape : {true, false}) out.push_back({t, 6, 13, reshape});
  return out;
}

INSTANTIATE_TEST_SUITE_P(DTypes, SteMulPairFusion, ::testing::ValuesIn(all_cases()));

// What the pass must leave alone, with the blocker's reason.
TEST(SteMulPairFusionLegality, OtherShapesOfTheChainStayUnfused) {
  struct Case {
    std::string label, why;
    std::function<void(Graph&, ValueId v)> change;
  };
  const std::vector<Case> cases = {
      {"masked gradient is an output", "graph output",
       [](Graph& g, ValueId v) { g.mark_output(v); }},
      {"a third reader", "exactly two readers",
       [](Graph& g, ValueId v) { g.mark_output(g.apply1("relu", {v})); }},
  };
  for (const Case& c : cases) {
    Graph g;
    const ValueId v = testing::build_mul_pair(g, {});
    c.change(g, v);
    const NodeId ste = g.value(g.node(g.value(v).producer).inputs.at(0)).producer;
    EXPECT_NE(ste_mul_pair_fusion_blocker(g, ste).find(c.why), std::string::npos)
        << c.label << ": " << ste_mul_pair_fusion_blocker(g, ste);
    EXPECT_EQ(mul_pair_rewrites(optimize(g, PassOptions{})), 0) << c.label;
    EXPECT_EQ(count_nodes(g, "fused_ste_mul_pair"), 0) << c.label;
  }
  // A broadcasting mul, and an add where a mul was.
  for (const std::string other : {"broadcast", "add"}) {
    Graph g;
    ValueId dy = g.input("dy", {DType::f32, {4, 8}});
    ValueId mask = g.input("mask", {DType::u8, {4}});
    ValueId a = g.input("a", {DType::f32, {4, 8}});
    ValueId row = g.input("row", {DType::f32, {8}});
    ValueId v = g.apply1("ste_backward", {dy, mask});
    g.mark_output(g.apply1("mul", {v, a}));
    g.mark_output(other == "add" ? g.apply1("add", {v, a}) : g.apply1("mul", {v, row}));
    const NodeId ste = g.value(v).producer;
    const std::string why = ste_mul_pair_fusion_blocker(g, ste);
    EXPECT_NE(why.find(other == "add" ? "is add" : "broadcasts"), std::string::npos) << why;
    EXPECT_EQ(mul_pair_rewrites(optimize(g, PassOptions{})), 0) << other;
  }
}

TEST(SteMulPairFusionErrors, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  ValueId m = g.input("m", {DType::u8, {1}});
  try {
    g.apply("fused_ste_mul_pair", {a, m, a, a}, {{"a_slot", int64_t{0}}, {"b_slot", int64_t{0}}});
    ADD_FAILURE() << "expected qg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_ste_mul_pair"), std::string::npos) << e.what();
  }
}

// Hand-built fused nodes (the pass never builds these): each bad input is a qg::Error from the
// kernel's check naming the op and what is wrong, not an out-of-bounds access.
TEST(SteMulPairFusionErrors, KernelRejectsBadInputs) {
  struct Bad {
    std::string label, expect;
    std::vector<std::string> inputs;
    std::vector<Node> from;
    int64_t a_slot = 0;
  };
  const Node ste = original_node("ste_backward"), mul = original_node("mul");
  const Node view = original_node("reshape", {{"shape", Shape{32}}});
  const std::vector<Bad> cases = {
      {"mask of 3 bytes", "mask", {"dy", "mask3", "a", "a"}, {ste, mul, mul}},
      {"i8 mask", "mask", {"dy", "mask_i8", "a", "a"}, {ste, mul, mul}},
      {"broadcasting b", "without broadcasting", {"dy", "mask", "a", "row"}, {ste, mul, mul}},
      {"f64 a", "without broadcasting", {"dy", "mask", "a64", "a"}, {ste, mul, mul}},
      {"three inputs", "takes 4 inputs", {"dy", "mask", "a"}, {ste, mul, mul}},
      {"no ste_backward first", "must be ste_backward", {"dy", "mask", "a", "a"}, {mul, mul, mul}},
      {"a relu in between",
       "only reshape",
       {"dy", "mask", "a", "a"},
       {ste, original_node("relu"), mul, mul}},
      {"an add last",
       "must be muls",
       {"dy", "mask", "a", "a"},
       {ste, view, mul, original_node("add")}},
      {"one mul", "fused_from", {"dy", "mask", "a", "a"}, {ste, mul}},
      {"slot 2", "must be 0 or 1", {"dy", "mask", "a", "a"}, {ste, mul, mul}, 2},
  };
  for (const Bad& c : cases) {
    Graph g;
    const std::map<std::string, TensorType> types = {
        {"dy", {DType::f32, {4, 8}}},  {"mask", {DType::u8, {4}}},  {"mask3", {DType::u8, {3}}},
        {"mask_i8", {DType::i8, {4}}}, {"a", {DType::f32, {4, 8}}}, {"a64", {DType::f64, {4, 8}}},
        {"row", {DType::f32, {8}}},
    };
    Executor::Feeds feeds;
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_ste_mul_pair");
    fused.name = "bad";
    fused.attrs.set("a_slot", c.a_slot);
    fused.attrs.set("b_slot", int64_t{1});
    for (const std::string& name : c.inputs) {
      if (!feeds.count(name)) {
        g.input(name, types.at(name));
        feeds[name] = Tensor::zeros(types.at(name).shape, types.at(name).dtype);
      }
      fused.inputs.push_back(g.at(name));
    }
    fused.fused_from = c.from;
    for (Node& n : fused.fused_from) n.inputs = {fused.inputs[0], fused.inputs[0]};
    const TensorType out{DType::f32, {4, 8}};
    const NodeId id = g.add_raw_node(fused, {out, out});
    try {
      Executor(g).run(feeds, {g.node(id).outputs[0]});
      ADD_FAILURE() << "expected qg::Error for " << c.label;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("fused_ste_mul_pair"), std::string::npos) << c.label << ": " << what;
      EXPECT_NE(what.find(c.expect), std::string::npos) << c.label << ": " << what;
    }
  }
}

// The bf16-mixed 8da4w Llama: one chain a layer (the down projection's masked input gradient
// and the two SwiGLU factors' muls). Through compile(), three Adam steps give the same losses
// and every state bit for bit as without the pass.
TEST(SteMulPairFusionLlama, TrainsBitForBitAsWithoutThePass) {
  testing::expect_llama_trains_as_without_mul_pair(Device::cpu());
}

}  // namespace
}  // namespace qg
