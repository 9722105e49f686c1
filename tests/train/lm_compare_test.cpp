// nn::run_lm_compare (`qat train --model llama --compare`) on a tiny Llama and synthetic token
// streams: each row equals the protocol rebuilt from public LmTrainer calls (PTQ: the float
// checkpoint's parameters evaluated under the recipe; QAT and the float reference: fine-tunes
// from those parameters and the float run's crop stream), --init starts from a float
// checkpoint, the table's arithmetic, and the bad inputs. The CLI run on the Python tutorial
// is at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/text_corpus.h"
#include "data/tokenizer.h"
#include "nn/llama_config.h"
#include "tests/common/lm_cli_test.h"
#include "tests/core/test_util.h"
#include "tests/train/tiny_lm_config.h"
#include "train/lm_compare.h"

namespace qg {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const std::string& kFixture = testing::kTinyLlamaFixture;

nn::LmTrainConfig tiny(int64_t intermediate = 32) {
  nn::LmTrainConfig c = testing::tiny_lm_config(16, intermediate, 1);
  c.validation_windows = 4;
  return c;
}

// A stream with some structure to learn, over 32 ids.
std::vector<int32_t> stream(size_t n) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i % 5) * 3 + (i / 7) % 3);
  return s;
}

nn::LmCompareConfig compare_config(const std::string& checkpoint) {
  nn::LmCompareConfig c;
  c.base = tiny();
  c.recipes = {"8da4w", "int4_weight_only"};
  c.qat_steps = 3;
  c.qat_lr = 1e-3;
  c.qat_warmup = 1;
  c.eval_every = 2;
  c.float_checkpoint = checkpoint;
  return c;
}

// The fine-tune `run_lm_compare` makes of the float checkpoint, rebuilt: the checkpoint's
// parameters, its crop stream, fresh moments, the fine-tune schedule.
double fine_tune_by_hand(const nn::LmCompareConfig& c, const nn::QConfig& qc,
                         const std::string& checkpoint, const std::vector<int32_t>& train,
                         const std::vector<int32_t>& valid) {
  nn::LmTrainer f(c.base, train, valid);
  f.load_checkpoint(checkpoint);  // the crop sampler as the float run left it
  nn::LmTrainConfig fc = c.base;
  fc.qconfig = qc;
  fc.lr = {c.qat_lr, c.qat_warmup, c.qat_steps, c.base.lr.min_ratio, c.base.lr.levels};
  fc.seed = 77;  // another initialisation, overwritten by the checkpoint's parameters
  nn::LmTrainer q(fc, train, valid);
  EXPECT_EQ(q.load_parameters(checkpoint), "float32");
  q.continue_crops_from(f);
  for (int64_t s = 0; s < c.qat_steps; ++s) q.train_step();
  return q.evaluate();
}

TEST(LmCompare, EveryRowIsTheProtocolRebuiltFromTheFloatCheckpoint) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  const std::string ckpt = (fs::temp_directory_path() / "qg_lm_compare_float.qgck").string();
  const nn::LmCompareConfig c = compare_config(ckpt);
  std::vector<std::string> lines;
  const nn::LmCompareResult r =
      nn::run_lm_compare(c, train, valid, [&](const std::string& l) { lines.push_back(l); });
  ASSERT_EQ(r.runs.size(), 2u);
  ASSERT_EQ(r.seeds.size(), 1u);
  EXPECT_EQ(r.windows, 4);  // every row reads the same capped windows
  EXPECT_FALSE(lines.empty());
  for (const nn::LmCompareRun& run : r.runs) {
    SCOPED_TRACE(run.recipe);
    const nn::QConfig qc = nn::parse_recipe(run.recipe, c.group_size);
    // PTQ: the float weights evaluated under the recipe, through another trainer.
    nn::LmTrainConfig pc = c.base;
    pc.qconfig = qc;
    pc.seed = 99;
    nn::LmTrainer p(pc, train, valid);
    EXPECT_EQ(p.load_parameters(ckpt), "float32");
    EXPECT_EQ(p.evaluate(), run.ptq_loss);
    // The recipe changes the evaluation: the row measures quantization.
    EXPECT_NE(run.ptq_loss, r.seeds[0].pretrained_loss);
    // QAT: the fine-tune from exactly the float weights and crops.
    EXPECT_EQ(fine_tune_by_hand(c, qc, ckpt, train, valid), run.qat_loss);
    EXPECT_EQ(run.history.back().step, c.qat_steps);
    EXPECT_EQ(run.history.back().validation_loss, run.qat_loss);
    ASSERT_EQ(run.history.size(), 2u);  // steps 2 and 3 (the last)
  }
  // The float reference: the same fine-tune without quantization, shared by every row.
  const double reference = fine_tune_by_hand(c, nn::QConfig::float32(), ckpt, train, valid);
  EXPECT_EQ(r.runs[0].float_loss, reference);
  EXPECT_EQ(r.runs[1].float_loss, reference);
  // The float row before the fine-tunes is the checkpoint's model.
  nn::LmTrainer f(c.base, train, valid);
  f.load_checkpoint(ckpt);
  EXPECT_EQ(f.evaluate(), r.seeds[0].pretrained_loss);
  EXPECT_EQ(f.step(), c.base.lr.total);

  // --init: the same float weights, so the same PTQ rows, with no float training.
  nn::LmCompareConfig ic = c;
  ic.init = ckpt;
  ic.float_checkpoint.clear();
  const nn::LmCompareResult ir = nn::run_lm_compare(ic, train, valid);
  EXPECT_TRUE(ir.seeds[0].float_history.empty());
  EXPECT_EQ(ir.seeds[0].pretrained_loss, r.seeds[0].pretrained_loss);
  EXPECT_EQ(ir.runs[0].ptq_loss, r.runs[0].ptq_loss);
  EXPECT_EQ(ir.runs[1].ptq_loss, r.runs[1].ptq_loss);
  fs::remove(ckpt);
}

// The one-recipe (8da4w) comparison run twice from the same seed, so with the same float
// model and crops: as configured, and with an option of the comparison set by `change` (that
// run's float model saved to `ckpt`), for the tests of those options.
struct OptionRuns {
  nn::LmCompareConfig config;  // with the option
  nn::LmCompareResult plain, with_option;
};

OptionRuns run_with_option(const std::string& ckpt,
                           const std::function<void(nn::LmCompareConfig&)>& change,
                           const std::vector<int32_t>& train, const std::vector<int32_t>& valid) {
  OptionRuns r;
  nn::LmCompareConfig plain = compare_config("");
  plain.recipes = {"8da4w"};
  r.plain = nn::run_lm_compare(plain, train, valid);
  r.config = plain;
  r.config.float_checkpoint = ckpt;
  change(r.config);
  r.with_option = nn::run_lm_compare(r.config, train, valid);
  return r;
}

// --embedding-quant with --compare: every recipe's PTQ and QAT runs quantize the token
// embedding (the PTQ row is the float checkpoint evaluated under the recipe plus the int8
// embedding), and the float rows stay float.
TEST(LmCompare, EmbeddingQuantReachesEveryQuantizedRow) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  const std::string ckpt = (fs::temp_directory_path() / "qg_lm_compare_embedding.qgck").string();
  OptionRuns runs = run_with_option(
      ckpt,
      [](nn::LmCompareConfig& c) {
        c.embedding_weight = nn::WeightQuant::int8;
        c.embedding_group_size = 8;
      },
      train, valid);
  nn::LmCompareConfig& c = runs.config;
  const nn::LmCompareResult &a = runs.plain, &b = runs.with_option;
  ASSERT_EQ(b.runs.size(), 1u);
  nn::QConfig qc = nn::parse_recipe("8da4w", c.group_size);
  qc.embedding_weight = nn::WeightQuant::int8;
  qc.embedding_group_size = 8;
  nn::LmTrainConfig pc = c.base;
  pc.qconfig = qc;
  nn::LmTrainer p(pc, train, valid);
  EXPECT_EQ(p.load_parameters(ckpt), "float32");
  EXPECT_EQ(p.evaluate(), b.runs[0].ptq_loss);
  EXPECT_NE(b.runs[0].ptq_loss, a.runs[0].ptq_loss);  // the embedding is quantized too
  EXPECT_EQ(fine_tune_by_hand(c, qc, ckpt, train, valid), b.runs[0].qat_loss);
  EXPECT_EQ(b.runs[0].float_loss, a.runs[0].float_loss);  // the float reference is not
  // A group size that does not divide the hidden size (16) fails before anything trains.
  c.embedding_group_size = 6;
  expect_error([&] { nn::validate_lm_compare(c); }, {"6"});
  fs::remove(ckpt);
}

// --learned-ranges with --compare: each recipe's run learns its weight scales. The PTQ row is
// the dynamic recipe's (the scales start from the float weights' dynamic qparams); the QAT
// fine-tune is the learned-range fine-tune rebuilt by hand, and differs from the dynamic one.
TEST(LmCompare, LearnedRangesReachEveryRecipe) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  const std::string ckpt = (fs::temp_directory_path() / "qg_lm_compare_learned.qgck").string();
  OptionRuns runs = run_with_option(
      ckpt,
      [](nn::LmCompareConfig& c) {
        c.learned_weight_ranges = true;
        c.base.learned_range_lr_factor = 0.1;
      },
      train, valid);
  nn::LmCompareConfig& c = runs.config;
  const nn::LmCompareResult &a = runs.plain, &b = runs.with_option;
  ASSERT_EQ(b.runs.size(), 1u);
  EXPECT_EQ(b.runs[0].ptq_loss, a.runs[0].ptq_loss);
  nn::QConfig qc = nn::parse_recipe("8da4w", c.group_size);
  qc.learned_weight_ranges = true;
  EXPECT_EQ(fine_tune_by_hand(c, qc, ckpt, train, valid), b.runs[0].qat_loss);
  EXPECT_NE(b.runs[0].qat_loss, a.runs[0].qat_loss);
  // int4 weight-only has a float zero point, which is not learnable: named before training.
  c.recipes = {"8da4w", "int4_weight_only"};
  expect_error([&] { nn::validate_lm_compare(c); }, {"int4 weight-only", "not learnable"});
  fs::remove(ckpt);
}

// --integer-forward with --compare: each recipe's PTQ row and QAT fine-tune run the integer
// forward. Its fine-tune is the integer-forward fine-tune rebuilt by hand.
TEST(LmCompare, IntegerForwardReachesEveryRecipe) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  const std::string ckpt = (fs::temp_directory_path() / "qg_lm_compare_integer.qgck").string();
  OptionRuns runs = run_with_option(
      ckpt, [](nn::LmCompareConfig& c) { c.integer_forward = true; }, train, valid);
  nn::LmCompareConfig& c = runs.config;
  const nn::LmCompareResult &a = runs.plain, &b = runs.with_option;
  ASSERT_EQ(b.runs.size(), 1u);
  // The PTQ rows differ by float rounding only, which this tiny model's f32 loss can absorb
  // entirely; the fine-tunes, which train on those rounding differences, do not.
  EXPECT_NEAR(b.runs[0].ptq_loss, a.runs[0].ptq_loss, 1e-3 * a.runs[0].ptq_loss);
  EXPECT_NE(b.runs[0].qat_loss, a.runs[0].qat_loss);
  nn::QConfig qc = nn::parse_recipe("8da4w", c.group_size);
  qc.integer_forward = true;
  EXPECT_EQ(fine_tune_by_hand(c, qc, ckpt, train, valid), b.runs[0].qat_loss);
  c.recipes = {"8da4w", "int4_weight_only"};
  expect_error([&] { nn::validate_lm_compare(c); }, {"integer forward"});
  fs::remove(ckpt);
}

TEST(LmCompare, SeedsChangeTheInitialisationAndTheCrops) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  nn::LmCompareConfig c = compare_config("");
  c.recipes = {"8da4w"};
  c.seeds = 2;
  const nn::LmCompareResult r = nn::run_lm_compare(c, train, valid);
  ASSERT_EQ(r.runs.size(), 2u);
  EXPECT_EQ(r.runs[0].seed, 5u);
  EXPECT_EQ(r.runs[1].seed, 6u);
  EXPECT_NE(r.seeds[0].pretrained_loss, r.seeds[1].pretrained_loss);
  EXPECT_NE(r.runs[0].qat_loss, r.runs[1].qat_loss);
  const std::vector<nn::LmCompareRow> rows = nn::summarize_lm_compare(r.runs);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].qat_ppl.n, 2);
  EXPECT_GT(rows[0].qat_ppl.std, 0);
}

TEST(LmCompare, CopiedParametersAreTheSourcesBitForBit) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  nn::LmTrainer f(tiny(), train, valid);
  f.train_step();
  nn::LmTrainConfig qc = tiny();
  qc.qconfig = nn::parse_recipe("8da4w", 32);
  qc.seed = 9;
  nn::LmTrainer q(qc, train, valid);
  q.copy_parameters_from(f);
  int compared = 0;
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "lm_head.weight", "model.norm.weight"}) {
    const Tensor& a = f.executor().parameter(name);
    const Tensor& b = q.executor().parameter(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 5);
  EXPECT_EQ(q.step(), 0);  // a fine-tune starts at step 0 of its own schedule
}

TEST(LmCompare, RecoveredFractionIsOfThePerplexityLoss) {
  EXPECT_DOUBLE_EQ(nn::recovered_fraction(10, 12, 10.5), 0.75);
  EXPECT_DOUBLE_EQ(nn::recovered_fraction(10, 12, 12.5), -0.25);  // QAT worse than PTQ
  EXPECT_DOUBLE_EQ(nn::recovered_fraction(10, 12, 9.5), 1.25);    // QAT better than float
  // A PTQ loss under 0.5% of the float perplexity has nothing to recover.
  EXPECT_TRUE(std::isnan(nn::recovered_fraction(10, 10.04, 10)));
  EXPECT_TRUE(std::isnan(nn::recovered_fraction(10, 9, 10)));
  EXPECT_FALSE(std::isnan(nn::recovered_fraction(10, 10.06, 10)));

  const nn::MeanStd m = nn::mean_std({1, 2, 3, std::nan("")});
  EXPECT_EQ(m.n, 3);
  EXPECT_DOUBLE_EQ(m.mean, 2);
  EXPECT_DOUBLE_EQ(m.std, 1);
  EXPECT_EQ(nn::mean_std({std::nan("")}).n, 0);

  // Per seed, then averaged: seed 1 recovers 0.5 of 10 -> 12, seed 2 0.9 of 10 -> 20.
  auto run = [](const char* recipe, uint64_t seed, double f, double p, double q) {
    nn::LmCompareRun r;
    r.recipe = recipe;
    r.seed = seed;
    r.float_loss = std::log(f);
    r.ptq_loss = std::log(p);
    r.qat_loss = std::log(q);
    return r;
  };
  const std::vector<nn::LmCompareRow> rows = nn::summarize_lm_compare(
      {run("8da4w", 1, 10, 12, 11), run("w8a8_dynamic", 1, 10, 10.01, 10),
       run("8da4w", 2, 10, 20, 11), run("w8a8_dynamic", 2, 10, 10.02, 10)});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].recipe, "8da4w");
  EXPECT_NEAR(rows[0].ptq_ppl.mean, 16, 1e-12);
  EXPECT_NEAR(rows[0].qat_ppl.mean, 11, 1e-12);
  EXPECT_NEAR(rows[0].recovered.mean, 0.7, 1e-12);
  EXPECT_NEAR(rows[0].recovered.std, std::sqrt(0.08), 1e-12);
  EXPECT_EQ(rows[1].recipe, "w8a8_dynamic");
  EXPECT_EQ(rows[1].recovered.n, 0);  // n/a
  EXPECT_EQ(nn::lm_recipe_label("8da4w", 64), "8da4w g64");
  EXPECT_EQ(nn::lm_recipe_label("w8a8_dynamic", 64), "w8a8_dynamic");
}

TEST(LmCompare, BadInputsAreNamedErrors) {
  const std::vector<int32_t> train = stream(600), valid = stream(80);
  auto with = [](const std::function<void(nn::LmCompareConfig&)>& edit) {
    nn::LmCompareConfig c = compare_config("");
    edit(c);
    return c;
  };
  expect_error(
      [&] {
        nn::validate_lm_compare(with([](auto& c) { c.recipes = {"8da4w", "int5"}; }));
      },
      {"[qconfig]", "recipe 'int5' is not one of"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.recipes = {"float"}; })); },
               {"[train.compare]", "recipe 'float' is the reference"});
  expect_error(
      [&] {
        nn::validate_lm_compare(with([](auto& c) { c.recipes = {"8da4w", "8da4w"}; }));
      },
      {"[train.compare]", "recipe '8da4w' is given twice"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.recipes.clear(); })); },
               {"[train.compare]", "no recipe"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.group_size = 48; })); },
               {"[qconfig]", "group size 48 is not one of 32, 64, 128, 256"});
  // Group 32 does not split the MLP's 48 inputs.
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.base = tiny(48); })); },
               {"[nn]", "down_proj", "group size 32 does not divide its 48 inputs"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.qat_steps = 0; })); },
               {"[train.compare]", "QAT steps 0", "must be >= 1"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.seeds = 0; })); },
               {"[train.compare]", "seeds 0"});
  expect_error([&] { nn::validate_lm_compare(with([](auto& c) { c.qat_lr = 0; })); },
               {"[train.compare]", "QAT learning rate 0 must be finite and > 0"});

  // --init: a checkpoint of a quantized recipe, and one of another architecture.
  const std::string ckpt = (fs::temp_directory_path() / "qg_lm_compare_init.qgck").string();
  nn::LmTrainConfig q = tiny();
  q.qconfig = nn::parse_recipe("8da4w", 32);
  nn::LmTrainer(q, train, valid).save_checkpoint(ckpt);
  expect_error(
      [&] { nn::run_lm_compare(with([&](auto& c) { c.init = ckpt; }), train, valid); },
      {"[train.compare]", "was trained with the recipe 'W4A8dyn", "starts from a float model"});
  nn::LmTrainer(tiny(64), train, valid).save_checkpoint(ckpt);
  expect_error([&] { nn::run_lm_compare(with([&](auto& c) { c.init = ckpt; }), train, valid); },
               {"[checkpoint]", "intermediate=64", "this trainer's is", "intermediate=32"});
  fs::remove(ckpt);
}

// `qat train --model llama --compare` on the Python tutorial: two recipes, a few steps.
TEST(LmCompare, CommandLineRunWritesTheTable) {
  QG_REQUIRE_LM_CLI(corpus, qat);
  const fs::path dir = fs::temp_directory_path() / "qg_lm_compare_cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The fixture's MLP has 176 inputs: group 256 covers a whole row there.
  const std::string cmd = std::string(qat) + " train --model llama --compare --config " + kFixture +
                          " --data " + (dir / "data").string() + " --corpus " + corpus + " --out " +
                          (dir / "out").string() +
                          " --device cpu --recipes 8da4w,w8a8_dynamic --group-size 256"
                          " --steps 30 --qat-steps 10 --eval-every 10 --eval-windows 16"
                          " --lr 3e-3 --warmup 5 > " +
                          (dir / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "log.txt");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("recovered"), std::string::npos) << text;
  EXPECT_NE(text.find("8da4w g256"), std::string::npos) << text;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "out" / "compare.json"));
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["recipe"], "8da4w");
  EXPECT_EQ(j["rows"][1]["recipe"], "w8a8_dynamic");
  EXPECT_EQ(j["validation_windows"], 16);
  // The float reference is one model: the same in every row.
  EXPECT_EQ(j["rows"][0]["float_perplexity"], j["rows"][1]["float_perplexity"]);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["ptq_perplexity"].get<double>(), 1.0);
    EXPECT_GT(row["qat_perplexity"].get<double>(), 1.0);
  }
  std::ifstream csv(dir / "out" / "compare.csv");
  int lines = 0;
  for (std::string l; std::getline(csv, l);) ++lines;
  EXPECT_EQ(lines, 3);  // header + one line per recipe
  EXPECT_TRUE(fs::exists(dir / "out" / "curves.png"));
  EXPECT_TRUE(fs::exists(dir / "out" / "float.qgck"));

  // A single run started from the float model's parameters (here: QAT with a recipe).
  const std::string init = std::string(qat) + " train --model llama --config " + kFixture +
                           " --data " + (dir / "data").string() + " --corpus " + corpus +
                           " --out " + (dir / "init").string() + " --init " +
                           (dir / "out" / "float.qgck").string() +
                           " --device cpu --recipe 8da4w --group-size 256 --steps 2"
                           " --eval-every 2 --eval-windows 16 > " +
                           (dir / "init.txt").string() + " 2>&1";
  const int init_rc = std::system(init.c_str());
  std::ifstream init_log(dir / "init.txt");
  const std::string init_text((std::istreambuf_iterator<char>(init_log)),
                              std::istreambuf_iterator<char>());
  ASSERT_EQ(init_rc, 0) << init_text;
  EXPECT_NE(init_text.find("initialised from the parameters of"), std::string::npos) << init_text;
  EXPECT_NE(init_text.find("(trained as float32)"), std::string::npos) << init_text;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qg
