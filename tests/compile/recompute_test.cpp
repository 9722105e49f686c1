// Activation recomputation (autograd/recompute.h) through compile(): a region with a stateful
// node (dropout, whose step counter is its RNG state) trains bit for bit as without
// recomputation and advances that state once per step; the reported plan is the static run's;
// bad regions are named errors.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/compile.h"
#include "runtime/memory_plan.h"
#include "tests/core/test_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

// x -> [matmul W1 -> silu -> silu -> dropout -> silu] -> matmul W2 -> cross-entropy; the
// bracket is the region (node ids [begin, end)). The backward reads the matmul's and the first
// silu's outputs (copied) and the dropout's y and mask (kept: the dropout is stateful).
struct SmallNet {
  Graph g;
  ValueId loss = kNoValue;
  std::vector<ValueId> params;
  RecomputeRegion region;
  NodeId dropout = -1;
};

void build(SmallNet& n) {
  Graph& g = n.g;
  ValueId x = g.input("x", {DType::f32, {8, 16}});
  ValueId labels = g.input("labels", {DType::i64, {8}});
  std::vector<float> w1(16 * 16), w2(4 * 16);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.05f * static_cast<float>((i * 7) % 11) - 0.2f;
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.04f * static_cast<float>((i * 5) % 13) - 0.2f;
  ValueId W1 = g.parameter("w1", Tensor::from_vector<float>({16, 16}, w1));
  ValueId W2 = g.parameter("w2", Tensor::from_vector<float>({4, 16}, w2));
  n.params = {W1, W2};
  n.region.name = "block";
  n.region.begin = g.num_nodes();
  ValueId h = g.apply1("matmul", {x, W1}, {{"transpose_b", true}}, "block.fc");
  h = g.apply1("silu", {h}, {}, "block.act");
  h = g.apply1("silu", {h}, {}, "block.act1");
  std::vector<ValueId> d =
      g.apply("dropout", {h}, {{"p", 0.5}, {"seed", int64_t{3}}}, "block.drop");
  n.dropout = g.value(d[0]).producer;
  h = g.apply1("silu", {d[0]}, {}, "block.act2");
  n.region.end = g.num_nodes();
  ValueId logits = g.apply1("matmul", {h, W2}, {{"transpose_b", true}}, "head");
  n.loss = g.apply1("softmax_cross_entropy", {logits, labels}, {{"reduction", "mean"}}, "loss");
}

Executor::Feeds feeds(int step) {
  std::vector<float> x(8 * 16);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.1f * static_cast<float>((i * 3 + static_cast<size_t>(step)) % 17) - 0.8f;
  std::vector<int64_t> labels(8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i + step) % 4);
  return {{"x", Tensor::from_vector<float>({8, 16}, x)},
          {"labels", Tensor::from_vector<int64_t>({8}, labels)}};
}

std::unique_ptr<CompiledStep> compile_net(SmallNet& n, bool recompute) {
  build(n);
  nn::OptimizerConfig opt;
  opt.kind = "sgd";
  opt.lr = 0.1;
  TrainingSpec spec{n.loss, n.params, nn::optimizer_nodes(opt), {}};
  if (recompute) spec.recompute = {n.region};
  return std::make_unique<CompiledStep>(n.g, spec, CompileOptions{});
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Recompute, StatefulNodeRunsOncePerStepAndTrainingIsBitForBit) {
  SmallNet a, b;
  auto plain = compile_net(a, false);
  auto recomputed = compile_net(b, true);
  const RecomputeStats& stats = recomputed->recompute_stats();
  EXPECT_EQ(stats.regions, 1);
  EXPECT_EQ(stats.kept_stateful, 1);  // the dropout
  EXPECT_EQ(stats.copied_nodes, 2);   // the matmul and the first silu
  // No copy of the dropout exists: one node of its op in the whole graph.
  int dropouts = 0;
  for (NodeId id = 0; id < b.g.num_nodes(); ++id)
    dropouts += !b.g.node(id).dead && b.g.node(id).op->name == "dropout";
  EXPECT_EQ(dropouts, 1);
  for (int step = 0; step < 3; ++step) {
    const Tensor la = plain->train(feeds(step), {a.loss})[0].clone();
    const Tensor lb = recomputed->train(feeds(step), {b.loss})[0].clone();
    EXPECT_TRUE(same_bytes(la, lb)) << "step " << step;
  }
  std::map<std::string, Tensor*> want = state_index(plain->executor());
  std::map<std::string, Tensor*> got = state_index(recomputed->executor());
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [key, t] : want) EXPECT_TRUE(same_bytes(*t, *got.at(key))) << key;
  // Three training steps: the generator's step advanced three times, not six.
  EXPECT_EQ(got.at("block.drop/step")->data<int64_t>()[0], 3);
}

TEST(Recompute, ReportedPlanIsTheStaticRunsPlan) {
  SmallNet n;
  auto step = compile_net(n, true);
  const int64_t planned = step->planned_arena_bytes({n.loss}, true, true);
  EXPECT_GT(planned, 0);
  step->train(feeds(0), {n.loss});  // the executor's run
  step->train(feeds(1), {n.loss});  // the static run over the memory plan
  EXPECT_EQ(step->arena_bytes({n.loss}, true, true), planned);
}

TEST(Recompute, BadRegionsAreNamedErrors) {
  auto compile_with = [](std::vector<RecomputeRegion> (*regions)(const SmallNet&)) {
    SmallNet n;
    build(n);
    nn::OptimizerConfig opt;
    opt.kind = "sgd";
    TrainingSpec spec{n.loss, n.params, nn::optimizer_nodes(opt), {}};
    spec.recompute = regions(n);
    CompiledStep step(n.g, spec, CompileOptions{});
  };
  expect_error(
      [&] {
        compile_with([](const SmallNet& n) {
          return std::vector<RecomputeRegion>{{"empty", n.region.begin, n.region.begin}};
        });
      },
      {"[recompute]", "region 'empty'", "is empty or not within the forward nodes"});
  expect_error(
      [&] {
        compile_with([](const SmallNet& n) {
          return std::vector<RecomputeRegion>{{"past", n.region.begin, n.g.num_nodes() + 5}};
        });
      },
      {"[recompute]", "region 'past'", "not within the forward nodes"});
  expect_error(
      [&] {
        compile_with([](const SmallNet& n) {
          return std::vector<RecomputeRegion>{{"a", n.region.begin, n.region.end},
                                              {"b", n.region.begin + 1, n.region.end + 1}};
        });
      },
      {"[recompute]", "overlap"});
}

}  // namespace
}  // namespace qg
