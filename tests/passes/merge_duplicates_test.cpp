// The driver's merge_duplicate_nodes pass (runtime/passes/merge_duplicates.h): equal nodes
// become one, chains merge whole, and what must stay apart does (other attributes or inputs,
// states, graph outputs, control dependencies, in-place writers). On the bf16-mixed tiny Llama
// it removes the q/k/v and gate/up input casts beyond the first, and three Adam steps through
// compile() are bit for bit the steps without it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "core/graph_rewrite.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "runtime/passes/merge_duplicates.h"
#include "runtime/passes/pass.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::count_live_ops;

Attrs to(const char* dtype) {
  return {{"dtype", std::string(dtype)}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// x -> three casts to bf16, each cast back to f32, summed: the casts and the casts back merge.
struct ThreeCasts {
  Graph g;
  ValueId x, y;
  ThreeCasts() {
    x = g.input("x", {DType::f32, {4, 8}});
    ValueId sum = kNoValue;
    for (int i = 0; i < 3; ++i) {
      ValueId back = g.apply1("cast", {g.apply1("cast", {x}, to("bf16"))}, to("f32"));
      sum = sum == kNoValue ? back : g.apply1("add", {sum, back});
    }
    y = sum;
    g.mark_output(y);
  }
};

TEST(MergeDuplicates, EqualNodesAndTheChainsBelowThemBecomeOne) {
  ThreeCasts plain, merged;
  EXPECT_EQ(merge_duplicate_nodes(merged.g), 4);  // two casts to bf16, two casts back
  EXPECT_EQ(count_live_ops(merged.g, "cast"), 2);
  EXPECT_EQ(count_live_ops(merged.g, "add"), 2);  // (c + c) + c: the adds differ
  merged.g.validate();
  std::vector<float> values(32);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.37f * static_cast<float>(i) - 5.1f;
  const Tensor x = Tensor::from_vector<float>({4, 8}, values);
  Executor a(plain.g), b(merged.g);
  EXPECT_TRUE(same_bits(a.run({{"x", x}}, {plain.y})[0], b.run({{"x", x}}, {merged.y})[0]));
  EXPECT_EQ(merge_duplicate_nodes(merged.g), 0);  // nothing left to merge
}

TEST(MergeDuplicates, OtherAttributesOrInputsStayApart) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4, 8}});
  ValueId z = g.input("z", {DType::f32, {4, 8}});
  g.mark_output(g.apply1("add", {g.apply1("cast", {g.apply1("cast", {x}, to("bf16"))}, to("f32")),
                                 g.apply1("cast", {g.apply1("cast", {x}, to("f16"))}, to("f32"))}));
  g.mark_output(g.apply1("sub", {x, z}));
  g.mark_output(g.apply1("sub", {z, x}));  // the inputs' order matters
  EXPECT_EQ(merge_duplicate_nodes(g), 0);
}

TEST(MergeDuplicates, StatefulOutputAndOrderedNodesStayApart) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {16}});
  // Observers keep running statistics: two are two states, however equal their inputs.
  ValueId o1 = g.apply("minmax_observer", {x})[0], o2 = g.apply("minmax_observer", {x})[0];
  g.mark_output(g.apply1("add", {o1, o2}));
  EXPECT_EQ(count_live_ops(g, "minmax_observer"), 2);
  // A value fetched by id keeps its node.
  ValueId r1 = g.apply1("relu", {x}), r2 = g.apply1("relu", {x});
  g.mark_output(r1);
  g.mark_output(r2);
  // A node ordered by a control dependency (activation recomputation's copies).
  ValueId n1 = g.apply1("neg", {x}), n2 = g.apply1("neg", {x});
  g.add_control_dependency(g.value(r1).producer, g.value(n2).producer);
  g.mark_output(g.apply1("add", {n1, n2}));
  EXPECT_EQ(merge_duplicate_nodes(g), 0);
  EXPECT_EQ(count_live_ops(g, "minmax_observer"), 2);
}

nn::LlamaModel tiny(Graph& g, const std::string& recipe) {
  return nn::build_llama(g, testing::tiny_llama_config(), 2, 7, nn::parse_recipe(recipe, 32), 3,
                         nn::PrecisionPolicy::bf16_mixed());
}

// Per layer the q/k/v projections' shared input is cast three times and the gate/up one twice
// (torch.autocast casts once per Linear): 3 casts a layer merge away (and in float the
// flattens before them too). Through compile(), three
// Adam steps give the same losses and every state bit for bit as without the pass: the merge
// runs after autograd, so each cast keeps its own gradient node.
TEST(MergeDuplicates, Bf16MixedLlamaTrainsBitForBitAsWithoutIt) {
  for (const std::string recipe : {"8da4w", "float"}) {
    SCOPED_TRACE(recipe);
    std::map<bool, std::vector<Tensor>> losses;
    std::map<bool, std::map<std::string, Tensor>> states;
    for (bool merge : {false, true}) {
      Graph g;
      nn::LlamaModel m = tiny(g, recipe);
      CompileOptions options;
      if (!merge) options.passes.disabled.insert(kMergeDuplicates);
      CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}},
                        options);
      for (const PassRecord& r : step.passes())
        if (r.name == kMergeDuplicates) {
          EXPECT_EQ(r.ran, merge);
          // 3 casts a layer; float also flattens per linear (no shared quantizer): 3 more.
          EXPECT_EQ(r.rewrites, merge ? (recipe == "float" ? 6 : 3) * 2 : 0);
        }
      for (int s = 0; s < 3; ++s)
        losses[merge].push_back(step.train(testing::tiny_llama_feeds(), {m.loss})[0]);
      step.synchronize();
      for (const auto& [key, t] : state_index(step.executor()))
        states[merge].emplace(key, t->to(Device::cpu()));
    }
    for (int s = 0; s < 3; ++s) EXPECT_TRUE(same_bits(losses[false][s], losses[true][s])) << s;
    ASSERT_EQ(states[false].size(), states[true].size());
    for (const auto& [key, t] : states[false]) {
      ASSERT_TRUE(states[true].count(key)) << key;
      EXPECT_TRUE(same_bits(t, states[true].at(key))) << key;
    }
  }
}

}  // namespace
}  // namespace qg
