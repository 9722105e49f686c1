// nn::LmTrainer with learned weight ranges (QConfig::learned_weight_ranges): the scales are
// trained, saved under "<layer>.weight_scale", and a resumed run continues the uninterrupted
// one bit for bit; a checkpoint with learned ranges does not load into a trainer without them,
// nor the reverse; a fine-tune that starts from another model's parameters restarts the
// ranges from those weights.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "nn/learned_ranges.h"
#include "nn/llama_config.h"
#include "tests/core/test_util.h"
#include "tests/train/tiny_lm_config.h"
#include "train/checkpoint.h"
#include "train/lm_trainer.h"

namespace qg {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

nn::LmTrainConfig tiny(bool learned_ranges, const std::string& recipe = "8da4w") {
  nn::LmTrainConfig c = testing::tiny_lm_config(32, 64, 1);
  c.optimizer.kind = "adamw";
  c.qconfig = nn::parse_recipe(recipe, 32);
  c.qconfig.learned_weight_ranges = learned_ranges;
  // The scales (~1e-3 per channel at int8) would cross zero at the weights' rate.
  c.learned_range_lr_factor = 0.01;
  return c;
}

std::vector<int32_t> pattern(size_t n, int32_t vocab) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i % 5) * 3 % vocab);
  return s;
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / name).string();
}

Tensor scale_of(nn::LmTrainer& t, const std::string& layer) {
  return t.executor().parameter(layer + ".weight_scale").clone();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

const std::string kQ = "model.layers.0.self_attn.q_proj";

TEST(LmLearnedRanges, ResumedRunContinuesTheUninterruptedOneBitForBit) {
  for (const std::string recipe : {"8da4w", "w8a8_dynamic"}) {
    SCOPED_TRACE(recipe);
    std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
    nn::LmTrainer a(tiny(true, recipe), train, valid);
    const Tensor initial = scale_of(a, kQ);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(a.train_step());
    const std::string path = temp("qg_lm_learned_resume.qgck");
    a.save_checkpoint(path);
    const Tensor saved = scale_of(a, kQ);
    EXPECT_FALSE(same_bits(initial, saved)) << "the scales did not train";
    // The checkpoint holds every scale under its parameter's name.
    bool found = false;
    for (const nn::CheckpointSection& s : nn::read_checkpoint(path))
      found |= s.name == "state/" + kQ + ".weight_scale/value";
    EXPECT_TRUE(found);
    for (int i = 0; i < 5; ++i) losses.push_back(a.train_step());
    const Tensor final_scale = scale_of(a, kQ);

    nn::LmTrainer b(tiny(true, recipe), train, valid);
    b.load_checkpoint(path);
    fs::remove(path);
    EXPECT_TRUE(same_bits(scale_of(b, kQ), saved));
    for (int i = 3; i < 8; ++i) EXPECT_EQ(b.train_step(), losses[static_cast<size_t>(i)]) << i;
    EXPECT_TRUE(same_bits(scale_of(b, kQ), final_scale));
    EXPECT_LT(losses.back(), losses.front());
  }
}

TEST(LmLearnedRanges, CheckpointsOfTheOtherKindAreRefused) {
  std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  nn::LmTrainer with(tiny(true), train, valid), without(tiny(false), train, valid);
  const std::string learned_path = temp("qg_lm_learned.qgck"),
                    dynamic_path = temp("qg_lm_dyn.qgck");
  with.save_checkpoint(learned_path);
  without.save_checkpoint(dynamic_path);
  expect_error([&] { without.load_checkpoint(learned_path); },
               {"[checkpoint]", "learned ranges", "weights per group of 32, dynamic"});
  expect_error([&] { with.load_checkpoint(dynamic_path); },
               {"[checkpoint]", "learned ranges", "weights per group of 32, dynamic"});
  fs::remove(learned_path);
  fs::remove(dynamic_path);
}

// A fine-tune's starting point (--init, --compare): the weights come from the other model,
// and the learned ranges restart from the dynamic qparams of those weights.
TEST(LmLearnedRanges, ParametersFromAnotherModelRestartTheRanges) {
  std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  nn::LmTrainConfig float_config = tiny(false);
  float_config.qconfig = nn::QConfig();
  float_config.seed = 9;  // other weights than the learned trainer's
  nn::LmTrainer pre(float_config, train, valid);
  for (int i = 0; i < 2; ++i) pre.train_step();
  const std::string path = temp("qg_lm_learned_init.qgck");
  pre.save_checkpoint(path);
  const Tensor weight = pre.executor().parameter(kQ + ".weight").clone();
  const nn::QConfig qc = tiny(true).qconfig;
  const Tensor want = nn::initial_weight_scale(weight, qc, DType::f32);

  nn::LmTrainer from_file(tiny(true), train, valid);
  EXPECT_FALSE(same_bits(scale_of(from_file, kQ), want));
  from_file.load_parameters(path);
  EXPECT_TRUE(same_bits(from_file.executor().parameter(kQ + ".weight"), weight));
  EXPECT_TRUE(same_bits(scale_of(from_file, kQ), want));

  nn::LmTrainer from_trainer(tiny(true), train, valid);
  from_trainer.copy_parameters_from(pre);
  EXPECT_TRUE(same_bits(scale_of(from_trainer, kQ), want));
  fs::remove(path);
}

}  // namespace
}  // namespace qg
