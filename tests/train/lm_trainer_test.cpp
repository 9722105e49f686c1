// nn::LmTrainer: a tiny Llama on token streams. Synthetic streams test the loop itself
// (resume, errors); the learning test trains the committed tiny config on the Python
// tutorial through `qat train --model llama` and must beat the unigram baseline.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/text_corpus.h"
#include "data/tokenizer.h"
#include "nn/llama_config.h"
#include "tests/common/lm_cli_test.h"
#include "tests/core/test_util.h"
#include "tests/train/tiny_lm_config.h"
#include "train/lm_trainer.h"

namespace qg {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const std::string& kFixture = testing::kTinyLlamaFixture;

nn::LmTrainConfig tiny(int64_t vocab = 32) {
  return testing::tiny_lm_config(16, 32, 1, vocab);
}

// A stream with structure to learn: a repeated pattern of period 5, over `vocab` ids.
std::vector<int32_t> pattern(size_t n, int32_t vocab) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i % 5) * 3 % vocab);
  return s;
}

// Float and W8A8 (the observers' statistics must carry over the resume).
TEST(LmTrainer, ResumedRunContinuesTheUninterruptedOneBitForBit) {
  for (const nn::QConfig& qc : {nn::QConfig(), nn::QConfig::w8a8()}) {
    SCOPED_TRACE(qc.str());
    std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
    nn::LmTrainConfig c = tiny();
    c.qconfig = qc;
    nn::LmTrainer a(c, train, valid);
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(a.train_step());
    const std::string path = (fs::temp_directory_path() / "qg_lm_resume.qgck").string();
    a.save_checkpoint(path);
    for (int i = 0; i < 5; ++i) losses.push_back(a.train_step());
    const double va = a.evaluate();

    nn::LmTrainer b(c, train, valid);
    b.load_checkpoint(path);
    fs::remove(path);
    EXPECT_EQ(b.step(), 3);
    for (int i = 3; i < 8; ++i) EXPECT_EQ(b.train_step(), losses[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(b.evaluate(), va);
    // adam reads the schedule's rate at run time: one compiled step for the whole run.
    EXPECT_EQ(a.compiles(), 1);
    EXPECT_LT(losses.back(), losses.front());
  }
}

TEST(LmTrainer, CheckpointOfAnotherModelIsRefused) {
  std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  nn::LmTrainer a(tiny(), train, valid);
  const std::string path = (fs::temp_directory_path() / "qg_lm_other.qgck").string();
  a.save_checkpoint(path);
  nn::LmTrainConfig wider = tiny();
  wider.model.intermediate_size = 48;
  nn::LmTrainer b(wider, train, valid);
  expect_error([&] { b.load_checkpoint(path); },
               {"[checkpoint]", "intermediate=32", "intermediate=48"});
  fs::remove(path);
}

TEST(LmTrainer, BadInputsAreNamedErrors) {
  std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  // The tokenizer has more pieces than the model has embeddings.
  std::vector<int32_t> big = train;
  big[17] = 40;
  expect_error([&] { nn::LmTrainer(tiny(), big, valid); },
               {"[train.lm]", "token id 40", "training", ">= the config's vocab_size 32"});
  nn::LmTrainConfig c = tiny();
  c.seq = 65;
  expect_error([&] { nn::LmTrainer(c, train, valid); },
               {"[train.lm]", "seq 65 exceeds the config's max_position_embeddings 64"});
  expect_error([&] { nn::LmTrainer(tiny(), train, pattern(15, 32)); },
               {"[train.lm]", "15 tokens holds 1 window(s) of 8 tokens, less than one batch of 2"});
  // A config.json without a required field.
  const fs::path cfg = fs::temp_directory_path() / "qg_lm_config.json";
  std::ofstream(cfg) << R"({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                          "num_attention_heads": 4})";
  expect_error([&] { nn::load_llama_config(cfg.string()); },
               {"[nn.llama_config]", "'vocab_size' is missing"});
  fs::remove(cfg);
}

TEST(LmTrainer, UnigramBaselineIsTheTrainingFrequenciesCrossEntropy) {
  // Training stream: ids 0 and 1 equally often; validation: only 0. With add-one smoothing
  // over 32 ids, p(0) = (200 + 1) / (400 + 32).
  std::vector<int32_t> train(400), valid(64, 0);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<int32_t>(i % 2);
  nn::LmTrainer t(tiny(), train, valid);
  EXPECT_NEAR(t.unigram_validation_loss(), -std::log(201.0 / 432.0), 1e-12);
}

// The CI learning check: the committed tiny config (hidden 64, 2 layers, 4 heads, 2 KV
// heads, vocab 512) on the tutorial's 16 training files, 400 steps of 8 x 64 tokens on the
// CPU. The validation perplexity must fall well below the unigram model's.
TEST(LmTrainer, TinyLlamaOnThePythonTutorialBeatsTheUnigramBaseline) {
  QG_REQUIRE_LM_CLI(corpus, qat);
  const fs::path dir = fs::temp_directory_path() / "qg_lm_tutorial";
  fs::remove_all(dir);
  const std::string cmd = std::string(qat) + " train --model llama --config " + kFixture +
                          " --data " + (dir / "data").string() + " --corpus " + corpus + " --out " +
                          (dir / "out").string() +
                          " --device cpu --steps 400 --eval-every 200 --batch 8 --seq 64"
                          " --lr 3e-3 --warmup 20 --eval-windows 64 > " +
                          (dir / "log.txt").string() + " 2>&1";
  fs::create_directories(dir);
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "log.txt");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << text;
  std::ifstream metrics(dir / "out" / "metrics.json");
  nlohmann::json m = nlohmann::json::parse(metrics);
  const double ppl = m["validation_perplexity"], unigram = m["unigram_perplexity"];
  std::printf("tiny llama on the tutorial: validation perplexity %.2f, unigram %.2f\n", ppl,
              unigram);
  EXPECT_LT(ppl, 0.6 * unigram) << text;
  EXPECT_EQ(m["evaluations"].size(), 2u);
  EXPECT_TRUE(fs::exists(dir / "out" / "curves.png"));
  EXPECT_TRUE(fs::exists(dir / "out" / "metrics.csv"));
  EXPECT_TRUE(fs::exists(dir / "out" / "checkpoint.qgck"));
  EXPECT_TRUE(fs::exists(dir / "data" / "train.tokens"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qg
