// compile(): the one engine path. The trainer runs compiled steps (fused nodes, memory plan,
// no allocation per step, a CUDA-graph replay on the GPU); compiled results equal the
// executor's bit for bit; the passes change no bit on the CPU; steps compiled at several
// batch sizes share one set of states; bad feeds and fetches are errors naming what is wrong.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "runtime/backend.h"
#include "runtime/compile.h"
#include "tests/common/scoped_env.h"
#include "tests/core/test_util.h"
#include "tests/train/train_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::DigitsFixture;
using testing::expect_error;

// Sets QG_DISABLE_PASSES for the scope (compile() reads it through PassOptions::from_env).
class ScopedDisablePasses {
 public:
  explicit ScopedDisablePasses(const char* value) {
    const char* old = std::getenv("QG_DISABLE_PASSES");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("QG_DISABLE_PASSES", value, 1);
  }
  ~ScopedDisablePasses() {
    if (had_)
      setenv("QG_DISABLE_PASSES", old_.c_str(), 1);
    else
      unsetenv("QG_DISABLE_PASSES");
  }

 private:
  bool had_ = false;
  std::string old_;
};

int fused_nodes(const Graph& g) {
  int n = 0;
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (!g.node(id).dead && !g.node(id).fused_from.empty()) ++n;
  return n;
}

// Every state by key, as raw bytes on the host.
std::map<std::string, std::string> state_bytes(Executor& exec) {
  std::map<std::string, std::string> out;
  for (const auto& [key, t] : state_index(exec)) {
    Tensor c = t->to(Device::cpu());
    out[key] = std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return out;
}

class CompileTest : public ::testing::Test, public DigitsFixture {
 protected:
  nn::TrainConfig cnn_config(Device device = Device::cpu()) {
    nn::TrainConfig c = config(nn::QConfig::w8a8(), 16);
    c.model = "cnn";
    c.cnn.channels = {4, 8, 8};
    c.device = device;
    return c;
  }
};

TEST_F(CompileTest, TrainerRunsTheFusedGraph) {
  nn::Trainer t(cnn_config(), train, test);
  // Observer + fake-quant pairs, STE backward chains, conv-bn's channel division: the QAT
  // CNN's graph has fusions of several passes.
  EXPECT_GE(fused_nodes(t.graph()), 6);
  int passes_that_rewrote = 0;
  for (const PassRecord& r : t.compiled().passes()) passes_that_rewrote += r.rewrites > 0 ? 1 : 0;
  EXPECT_GE(passes_that_rewrote, 3);

  ScopedDisablePasses off("all");
  nn::Trainer plain(cnn_config(), train, test);
  EXPECT_EQ(fused_nodes(plain.graph()), 0);
  for (const PassRecord& r : plain.compiled().passes()) EXPECT_FALSE(r.ran) << r.name;
}

TEST_F(CompileTest, FusedTrainingEqualsUnfusedBitForBit) {
  nn::TrainConfig c = cnn_config();
  c.freeze_bn_after = 10;  // the freeze is written into a state compiled steps hold
  nn::Trainer fused(c, train, test);
  nn::EpochMetrics a = fused.train_epoch();
  ScopedDisablePasses off("all");
  nn::Trainer plain(c, train, test);
  nn::EpochMetrics b = plain.train_epoch();
  EXPECT_EQ(a.train_loss, b.train_loss);
  EXPECT_EQ(a.train_accuracy, b.train_accuracy);
  EXPECT_EQ(a.test_accuracy, b.test_accuracy);
  EXPECT_EQ(state_bytes(fused.executor()), state_bytes(plain.executor()));
}

TEST_F(CompileTest, CompiledStepsEqualTheExecutorBitForBit) {
  // The same graph built twice: one compiled (passes, plan, static launches), one run by
  // the plain executor after add_optimizer.
  nn::TrainConfig c = config(nn::QConfig::w4a8(), 16);
  Graph g1, g2;
  nn::Model m1 = nn::build_model(g1, c.spec(), c.qconfig, c.seed);
  nn::Model m2 = nn::build_model(g2, c.spec(), c.qconfig, c.seed);
  CompileOptions options;
  options.outputs = {m1.loss, m1.logits};
  CompiledStep step(g1, {m1.loss, m1.parameters, nn::optimizer_nodes(c.optimizer), {}}, options);
  std::vector<NodeId> updates = nn::add_optimizer(g2, m2.loss, m2.parameters, c.optimizer);
  Executor exec(g2);
  Tensor x = Tensor::empty({64, 64}, DType::f32), labels = Tensor::empty({64}, DType::i64);
  for (int s = 0; s < 5; ++s) {
    std::memcpy(x.data<float>(), train.x.data() + s * 64 * 64, sizeof(float) * 64 * 64);
    std::memcpy(labels.data<int64_t>(), train.labels.data() + s * 64, sizeof(int64_t) * 64);
    const std::vector<Tensor>& got = step.train({{"x", x}, {"labels", labels}}, {m1.loss});
    EXPECT_EQ(step.last_path({m1.loss}, true, true), s == 0 ? RunPath::executor : RunPath::launch);
    Tensor want = exec.run({{"x", x}, {"labels", labels}}, {m2.loss}, updates)[0];
    EXPECT_EQ(got[0].at(0), want.at(0)) << "step " << s;
  }
  EXPECT_EQ(state_bytes(step.executor()), state_bytes(exec));
  EXPECT_GT(step.kernels_per_launch({m1.loss}, true, true), 0);
  EXPECT_GT(step.arena_bytes({m1.loss}, true, true), 0);
}

TEST_F(CompileTest, NoAllocationPerStepAfterWarmUp) {
  nn::Trainer t(cnn_config(), train, test);
  uint64_t at_step_4 = 0, at_step_12 = 0;
  t.train_epoch([&](const nn::StepInfo& s) {
    if (s.step_in_epoch == 4) at_step_4 = allocation_count(DeviceType::cpu);
    if (s.step_in_epoch == 12) at_step_12 = allocation_count(DeviceType::cpu);
  });
  EXPECT_GT(at_step_4, 0u);
  EXPECT_EQ(at_step_12, at_step_4) << "host allocations in 8 steady-state training steps";
}

TEST_F(CompileTest, LastPartialBatchGetsItsOwnCompiledStep) {
  nn::TrainConfig c = config(nn::QConfig::w8a8(), 16);
  c.drop_last = false;
  nn::Trainer t(c, train, test);
  ASSERT_NE(train.size() % 64, 0);
  int steps = 0;
  t.train_epoch([&](const nn::StepInfo& s) { steps = static_cast<int>(s.steps_per_epoch); });
  EXPECT_EQ(steps, train.size() / 64 + 1);
  EXPECT_EQ(t.step(), steps);
  // Training batch, the training tail and the test tail (a third size).
  EXPECT_EQ(t.compiled_batch_sizes(), test.size() % 64 == train.size() % 64 ? 2 : 3);

  // The steps compiled at every size hold one set of states: the same bytes, not copies.
  nn::Trainer ref(c, train, test);
  ref.evaluate(test);  // compiles the test tail, sharing states
  EXPECT_EQ(ref.compiled_batch_sizes(), 2);
  const std::map<std::string, Tensor*> main_states = state_index(ref.executor());
  EXPECT_FALSE(main_states.empty());

  // drop_last (the default) trains on full batches only.
  nn::Trainer dropping(config(nn::QConfig::w8a8(), 16), train, test);
  dropping.train_epoch();
  EXPECT_EQ(dropping.step(), train.size() / 64);
}

TEST_F(CompileTest, SharedStatesAreOneTensor) {
  nn::TrainConfig c = config(nn::QConfig::w8a8(), 8);
  Graph ga, gb;
  nn::ModelSpec spec = c.spec();
  nn::Model ma = nn::build_model(ga, spec, c.qconfig, 1);
  spec.mlp.batch = 7;
  nn::Model mb = nn::build_model(gb, spec, c.qconfig, 2);
  CompiledStep a(ga, {ma.loss, ma.parameters, nn::optimizer_nodes(c.optimizer), {}}, {});
  {
    ScopedDisablePasses off("all");  // different fusions: keys must still match
    CompiledStep b(gb, {mb.loss, mb.parameters, nn::optimizer_nodes(c.optimizer), {}},
                   CompileOptions{});
    share_states(a.executor(), b.executor());
    std::map<std::string, Tensor*> sa = state_index(a.executor()), sb = state_index(b.executor());
    ASSERT_EQ(sa.size(), sb.size());
    for (const auto& [key, t] : sb) EXPECT_EQ(t->raw_data(), sa.at(key)->raw_data()) << key;
  }
  // A graph of another architecture has states the first lacks.
  Graph gc;
  nn::TrainConfig wide = config(nn::QConfig::w8a8(), 9);
  nn::Model mc = nn::build_model(gc, wide.spec(), wide.qconfig, 1);
  CompiledStep cstep(gc, {mc.loss, mc.parameters, nn::optimizer_nodes(c.optimizer), {}}, {});
  expect_error([&] { share_states(a.executor(), cstep.executor()); },
               {"compile", "here but", "f32[9"});
}

TEST_F(CompileTest, CheckpointsDoNotDependOnThePasses) {
  const std::string path = ::testing::TempDir() + "compile_passes.qgck";
  nn::TrainConfig c = cnn_config();
  nn::Trainer fused(c, train, test);
  fused.train_epoch();
  fused.save_checkpoint(path);
  ScopedDisablePasses off("all");
  nn::Trainer plain(c, train, test);
  plain.load_checkpoint(path);
  EXPECT_EQ(state_bytes(plain.executor()), state_bytes(fused.executor()));
  EXPECT_EQ(plain.evaluate(test), fused.evaluate(test));
  std::remove(path.c_str());
}

TEST_F(CompileTest, BadFeedsAndFetchesAreErrors) {
  nn::TrainConfig c = config(nn::QConfig::w8a8(), 8);
  Graph g;
  nn::Model m = nn::build_model(g, c.spec(), c.qconfig, 1);
  CompileOptions options;
  options.outputs = {m.loss, m.logits};
  CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes(c.optimizer), {}}, options);
  Tensor x = Tensor::zeros({64, 64}, DType::f32), labels = Tensor::zeros({64}, DType::i64);
  expect_error(
      [&] {
        step.train({{"x", Tensor::zeros({32, 64}, DType::f32)}, {"labels", labels}}, {m.loss});
      },
      {"compile", "'x'", "f32[64, 64]", "f32[32, 64]", "compile one step per shape"});
  expect_error(
      [&] {
        step.train({{"x", x}, {"labels", labels}, {"y", x}}, {m.loss});
      },
      {"compile", "feed 'y' does not name a graph input"});
  expect_error([&] { step.train({{"x", x}}, {m.loss}); }, {"compile", "'labels' was not fed"});
  expect_error(
      [&] {
        step.forward({{"x", x}}, {g.num_values() + 3}, false);
      },
      {"compile", "fetch of value"});
  expect_error(
      [] {
        Graph h;
        ValueId v = h.input("v", {DType::f32, {2}});
        CompiledStep bad(h, {v, {}, {}, {}}, {});
      },
      {"compile", "no optimizer"});
  // A forward-only program has no train mode.
  Graph f;
  nn::Model mf = nn::build_model(f, c.spec(), c.qconfig, 1);
  CompiledStep fwd(f, {}, {});
  expect_error(
      [&] {
        fwd.train({{"x", x}, {"labels", labels}}, {mf.loss});
      },
      {"compile", "without a loss"});
  // The errors changed nothing: the step still runs.
  EXPECT_NO_THROW(step.train({{"x", x}, {"labels", labels}}, {m.loss}));
}

// On a GPU: `qat train`'s trainer replays its step as a CUDA graph, runs the fused kernels
// and allocates nothing on the device per step.
TEST_F(CompileTest, CudaTrainerReplaysACapturedStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  nn::Trainer t(cnn_config(Device::cuda()), train, test);
  EXPECT_GE(fused_nodes(t.graph()), 6);
  uint64_t at_step_4 = 0, at_step_12 = 0;
  t.train_epoch([&](const nn::StepInfo& s) {
    if (s.step_in_epoch == 4) at_step_4 = allocation_count(DeviceType::cuda);
    if (s.step_in_epoch == 12) at_step_12 = allocation_count(DeviceType::cuda);
  });
  EXPECT_EQ(at_step_12, at_step_4) << "device allocations in 8 steady-state training steps";
  const nn::Model& m = t.model();
  EXPECT_EQ(t.compiled().last_path({m.loss, m.logits}, true, true), RunPath::replay);
  EXPECT_EQ(t.compiled().last_path({m.logits}, false, false), RunPath::replay);
  // The GPU run trains as the CPU run does (same accuracy to within a few test samples).
  nn::Trainer cpu(cnn_config(), train, test);
  cpu.train_epoch();
  EXPECT_NEAR(t.history().back().test_accuracy, cpu.history().back().test_accuracy, 0.05);
}

// QG_CUDA_GRAPH=0 turns the CUDA-graph replay off (steps launched kernel by kernel, which
// the collective trace needs); anything else, or nothing, leaves it on.
TEST(CompileOptionsTest, CudaGraphFollowsTheEnvironment) {
  {
    testing::ScopedEnv unset("QG_CUDA_GRAPH", nullptr);
    EXPECT_TRUE(CompileOptions{}.cuda_graph);
  }
  {
    testing::ScopedEnv off("QG_CUDA_GRAPH", "0");
    EXPECT_FALSE(cuda_graph_from_environment());
    EXPECT_FALSE(CompileOptions{}.cuda_graph);
  }
  {
    testing::ScopedEnv on("QG_CUDA_GRAPH", "1");
    EXPECT_TRUE(CompileOptions{}.cuda_graph);
  }
}

// On a GPU with QG_CUDA_GRAPH=0: the trainer's step is launched, never captured or replayed.
TEST_F(CompileTest, CudaGraphOffLaunchesEveryStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::ScopedEnv off("QG_CUDA_GRAPH", "0");
  nn::Trainer t(cnn_config(Device::cuda()), train, test);
  t.train_epoch();
  const nn::Model& m = t.model();
  EXPECT_EQ(t.compiled().last_path({m.loss, m.logits}, true, true), RunPath::launch);
}

}  // namespace
}  // namespace qg
