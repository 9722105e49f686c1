// The pass driver (runtime/passes): its one ordered table names every fusion rule the fused
// ops register, each once, and the driver's build step lets a node join only one rewrite.
#include <gtest/gtest.h>

#include <map>

#include "core/graph.h"
#include "core/op_registry.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

TEST(PassOrder, IsThePinnedPipeline) {
  const std::vector<std::string> expected = {"merge_duplicate_nodes",
                                             "fuse_observer_quantize",
                                             "fuse_ste_backward",
                                             "fuse_ste_optimizer",
                                             "fuse_ste_chain",
                                             "fuse_ste_producer",
                                             "fuse_ste_mul_pair",
                                             "fuse_channel_div_batch_norm",
                                             "fuse_activation_prologue",
                                             "fuse_scaled_softmax",
                                             "fuse_swiglu",
                                             "fuse_cast_add",
                                             "fuse_norm_backward_add",
                                             "fuse_norm_cast",
                                             "fuse_grad_cast",
                                             "fuse_cast_ste",
                                             "fuse_dfq_cast",
                                             "fuse_multi_tensor_cast",
                                             "fuse_multi_tensor_adam",
                                             "fuse_multi_tensor_adamw"};
  EXPECT_EQ(default_pass_names(), expected);
}

TEST(PassOrder, NamesEveryRegisteredRuleOnce) {
  std::map<std::string, std::string> rule_op;  // rule name -> the op registering it
  for (const OpDef* op : OpRegistry::instance().all())
    for (const FusionRule& rule : op->fusion_rules) {
      EXPECT_TRUE(rule_op.emplace(rule.name, op->name).second)
          << rule.name << " registered by " << op->name << " and " << rule_op[rule.name];
      EXPECT_TRUE(rule.match && rule.legal && rule.build) << rule.name;
    }
  std::map<std::string, int> listed;
  for (const std::string& name : default_pass_names())
    if (name != kMergeDuplicates) ++listed[name];  // the driver's own pass, no op's rule
  for (const auto& [name, count] : listed) {
    EXPECT_EQ(count, 1) << name;
    EXPECT_TRUE(rule_op.count(name)) << name << " is in the pass order but no op registers it";
  }
  for (const auto& [name, op] : rule_op)
    EXPECT_TRUE(listed.count(name)) << op << "'s rule " << name << " is not in the pass order";
}

TEST(PassOrder, RulesLiveWithTheOpTheyMake) {
  const std::map<std::string, std::string> expected = {
      {"fuse_observer_quantize", "fused_observe_quantize"},
      {"fuse_activation_prologue", "fused_observe_quantize"},
      {"fuse_ste_backward", "fused_ste_backward"},
      {"fuse_ste_optimizer", "fused_ste_optimizer"},
      {"fuse_ste_chain", "fused_ste_chain"},
      {"fuse_ste_producer", "fused_ste_producer"},
      {"fuse_ste_mul_pair", "fused_ste_mul_pair"},
      {"fuse_channel_div_batch_norm", "fused_channel_div_batch_norm"},
      {"fuse_scaled_softmax", "fused_scaled_softmax"},
      {"fuse_swiglu", "fused_swiglu"},
      {"fuse_cast_add", "fused_cast_add"},
      {"fuse_norm_backward_add", "fused_rms_norm_backward_add"},
      // The fused node is rms_norm itself, with out_dtype.
      {"fuse_norm_cast", "rms_norm"},
      // The fused node is the optimizer step itself, reading the narrow gradient.
      {"fuse_grad_cast", "adam"},
      {"fuse_cast_ste", "fused_cast_ste"},
      // The fused node is dynamic_fake_quantize itself, with out_dtype.
      {"fuse_dfq_cast", "dynamic_fake_quantize"},
      {"fuse_multi_tensor_cast", "fused_multi_tensor_cast"},
      {"fuse_multi_tensor_adam", "fused_multi_tensor_adam"},
      {"fuse_multi_tensor_adamw", "fused_multi_tensor_adamw"}};
  std::map<std::string, std::string> found;
  for (const OpDef* op : OpRegistry::instance().all())
    for (const FusionRule& rule : op->fusion_rules) found[rule.name] = op->name;
  EXPECT_EQ(found, expected);
}

// A made-up rule whose candidates overlap: every node with one reader pairs with it. In a
// chain a -> b -> c -> d the candidates (a, b), (b, c), (c, d) are all legal; the driver builds
// (a, b) and (c, d) and skips (b, c), whose b an earlier rewrite took.
TEST(RunFusionRule, BuildsOnlyCandidatesThatShareNoNode) {
  Graph g;
  ValueId v = g.input("x", {DType::f32, {4}});
  std::vector<NodeId> relu;
  for (int i = 0; i < 4; ++i) {
    v = g.apply1("relu", {v});
    relu.push_back(g.value(v).producer);
  }
  g.mark_output(v);
  std::vector<std::vector<NodeId>> built;
  FusionRule rule;
  rule.name = "test_pairs";
  rule.match = [](const Graph& graph, NodeId id) -> std::vector<FusionCandidate> {
    if (graph.node(id).op->name != "relu") return {};
    const auto readers = graph.consumers(graph.node(id).outputs.at(0));
    if (readers.size() != 1) return {};
    return {{{id, readers[0]}}};
  };
  rule.legal = [](const Graph&, const FusionCandidate&) { return std::string(); };
  rule.build = [&](Graph&, const FusionCandidate& c) { built.push_back(c.nodes); };
  EXPECT_EQ(run_fusion_rule(rule, g), 2);
  const std::vector<std::vector<NodeId>> expected = {{relu[0], relu[1]}, {relu[2], relu[3]}};
  EXPECT_EQ(built, expected);
}

// Candidates are built form by form: a form-1 candidate found first in topological order
// still comes after every form-0 candidate, and loses a shared node to it.
TEST(RunFusionRule, BuildsEarlierFormsFirst) {
  Graph g;
  ValueId v = g.input("x", {DType::f32, {4}});
  for (int i = 0; i < 3; ++i) v = g.apply1("relu", {v});
  g.mark_output(v);
  std::vector<int> forms;
  FusionRule rule;
  rule.name = "test_forms";
  rule.match = [](const Graph& graph, NodeId id) -> std::vector<FusionCandidate> {
    if (graph.node(id).op->name != "relu") return {};
    const auto readers = graph.consumers(graph.node(id).outputs.at(0));
    if (readers.size() != 1) return {};
    // The first pair (a, b), whose a reads the graph input, is form 1; (b, c) is form 0.
    const NodeId producer = graph.value(graph.node(id).inputs.at(0)).producer;
    const bool first = graph.node(producer).op->name != "relu";
    return {{{id, readers[0]}, first ? 1 : 0}};
  };
  rule.legal = [](const Graph&, const FusionCandidate&) { return std::string(); };
  rule.build = [&](Graph&, const FusionCandidate& c) { forms.push_back(c.form); };
  EXPECT_EQ(run_fusion_rule(rule, g), 1);
  EXPECT_EQ(forms, std::vector<int>{0});
}

TEST(RunFusionRule, IllegalCandidatesAreNotBuilt) {
  Graph g;
  ValueId v = g.input("x", {DType::f32, {4}});
  g.mark_output(g.apply1("relu", {g.apply1("relu", {v})}));
  int builds = 0;
  FusionRule rule;
  rule.name = "test_illegal";
  rule.match = [](const Graph& graph, NodeId id) -> std::vector<FusionCandidate> {
    if (graph.node(id).op->name != "relu") return {};
    return {{{id}}};
  };
  rule.legal = [](const Graph&, const FusionCandidate&) { return std::string("never"); };
  rule.build = [&](Graph&, const FusionCandidate&) { ++builds; };
  EXPECT_EQ(run_fusion_rule(rule, g), 0);
  EXPECT_EQ(builds, 0);
}

}  // namespace
}  // namespace qg
