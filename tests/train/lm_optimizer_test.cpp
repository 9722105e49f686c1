// nn::LmTrainer's optimizer: adamw with decoupled weight decay and gradient clipping, the
// schedule's exact rate through one compiled step, resumes (also from checkpoints without the
// rate's state), sgd's recompiled levels, and bf16-mixed training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "nn/llama_config.h"
#include "tests/core/test_util.h"
#include "tests/train/tiny_lm_config.h"
#include "train/checkpoint.h"
#include "train/lm_trainer.h"

namespace qg {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

nn::LmTrainConfig tiny_adamw() {
  nn::LmTrainConfig c = testing::tiny_lm_config(16, 32, 1);
  c.optimizer.kind = "adamw";
  c.optimizer.weight_decay = 0.1;
  c.optimizer.clip_grad_norm = 0.05;  // small enough to clip these steps
  return c;
}

std::vector<int32_t> pattern(size_t n) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i % 5) * 3 % 32);
  return s;
}

double rate_state(nn::LmTrainer& t) {
  const Graph& g = t.executor().graph();
  return t.executor()
      .state(g.value(g.find(nn::kLearningRateName)).producer, "value")
      .to(Device::cpu())
      .to_doubles()[0];
}

TEST(LmTrainerOptimizer, AdamWAppliesTheExactScheduleWithOneCompile) {
  std::vector<int32_t> train = pattern(400), valid = pattern(64);
  nn::LmTrainer t(tiny_adamw(), train, valid);
  std::vector<double> losses;
  for (int64_t s = 0; s < 8; ++s) {
    EXPECT_EQ(t.current_lr(), t.config().lr.at(s));
    losses.push_back(t.train_step());
    EXPECT_EQ(rate_state(t), t.config().lr.at(s)) << "step " << s;  // not a level
    EXPECT_TRUE(std::isfinite(t.last_grad_norm()));
    EXPECT_GT(t.last_grad_norm(), 0.05);  // so the steps were clipped
  }
  EXPECT_EQ(t.compiles(), 1);
  EXPECT_LT(losses.back(), losses.front());
}

TEST(LmTrainerOptimizer, SgdStillRecompilesAtTheScheduleLevels) {
  std::vector<int32_t> train = pattern(400), valid = pattern(64);
  nn::LmTrainConfig c = tiny_adamw();
  c.optimizer = nn::OptimizerConfig();
  c.optimizer.kind = "sgd";
  nn::LmTrainer t(c, train, valid);
  for (int s = 0; s < 8; ++s) t.train_step();
  EXPECT_GT(t.compiles(), 2);
  EXPECT_TRUE(std::isnan(t.last_grad_norm()));
}

TEST(LmTrainerOptimizer, ResumedAdamWRunContinuesBitForBit) {
  std::vector<int32_t> train = pattern(400), valid = pattern(64);
  nn::LmTrainer a(tiny_adamw(), train, valid);
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) a.train_step();
  const std::string path = (fs::temp_directory_path() / "qg_lm_adamw.qgck").string();
  a.save_checkpoint(path);
  for (int i = 0; i < 4; ++i) losses.push_back(a.train_step());

  // A checkpoint without the rate's section (as an attribute-rate trainer wrote them) loads,
  // and the rate comes from the schedule at the checkpoint's step.
  const std::string old = (fs::temp_directory_path() / "qg_lm_adamw_old.qgck").string();
  std::vector<nn::CheckpointSection> sections = nn::read_checkpoint(path);
  const size_t n = sections.size();
  sections.erase(std::remove_if(sections.begin(), sections.end(),
                                [](const nn::CheckpointSection& s) {
                                  return s.name ==
                                         std::string("state/") + nn::kLearningRateName + "/value";
                                }),
                 sections.end());
  ASSERT_EQ(sections.size() + 1, n);
  nn::write_checkpoint(old, sections);

  for (const std::string& file : {path, old}) {
    SCOPED_TRACE(file);
    nn::LmTrainer b(tiny_adamw(), train, valid);
    b.load_checkpoint(file);
    EXPECT_EQ(b.step(), 3);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.train_step(), losses[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(b.last_grad_norm(), a.last_grad_norm());
  }
  fs::remove(path);
  fs::remove(old);
}

TEST(LmTrainerOptimizer, Bf16MixedTrainsWithF32MasterWeights) {
  std::vector<int32_t> train = pattern(400), valid = pattern(64);
  nn::LmTrainConfig c = tiny_adamw();
  c.precision = nn::PrecisionPolicy::bf16_mixed();
  c.lr.peak = 1e-2;
  nn::LmTrainer t(c, train, valid);
  std::vector<double> losses;
  for (int i = 0; i < 8; ++i) losses.push_back(t.train_step());
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_EQ(t.compiles(), 1);
  const Graph& g = t.executor().graph();
  int bf16 = 0;
  for (NodeId id : g.parameters()) {
    EXPECT_EQ(g.value(g.node(id).outputs[0]).type.dtype, DType::f32) << g.node(id).name;
    for (NodeId r : g.consumers(g.node(id).outputs[0]))
      for (ValueId out : g.node(r).outputs) bf16 += g.value(out).type.dtype == DType::bf16;
  }
  EXPECT_GT(bf16, 0);  // the weights are cast to bf16 for the GEMMs
  // An f32 checkpoint does not load into a bf16-mixed trainer.
  const std::string path = (fs::temp_directory_path() / "qg_lm_f32.qgck").string();
  nn::LmTrainer f32(tiny_adamw(), train, valid);
  f32.save_checkpoint(path);
  expect_error([&] { t.load_checkpoint(path); }, {"checkpoint", "precision=bf16-mixed"});
  fs::remove(path);
}

TEST(LmTrainerOptimizer, BadOptimizerSettingsAreNamedErrors) {
  std::vector<int32_t> train = pattern(400), valid = pattern(64);
  nn::LmTrainConfig c = tiny_adamw();
  c.optimizer.weight_decay = -0.1;
  expect_error([&] { nn::LmTrainer(c, train, valid); },
               {"[nn.optimizer]", "weight_decay -0.1", ">= 0"});
  c = tiny_adamw();
  c.optimizer.clip_grad_norm = -1;
  expect_error([&] { nn::LmTrainer(c, train, valid); }, {"[nn.optimizer]", "clip_grad_norm -1"});
  c = tiny_adamw();
  c.optimizer.kind = "sgd";
  expect_error([&] { nn::LmTrainer(c, train, valid); },
               {"[nn.optimizer]", "sgd", "clip_grad_norm"});
  c = tiny_adamw();
  c.precision.compute = DType::i32;
  expect_error([&] { nn::LmTrainer(c, train, valid); }, {"compute", "i32"});
}

}  // namespace
}  // namespace qg
