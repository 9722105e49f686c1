// Float, PTQ and QAT perplexities of a language model under QAT recipes (nn::parse_recipe),
// `qat train --model llama --compare`. For each seed:
//   1. float: an LmTrainer trained base.lr.total steps from the seed's initialisation, or
//      the parameters of a float checkpoint (`init`) with the seed's crop stream;
//   2. float reference: the float weights fine-tuned qat_steps steps on the fine-tune
//      schedule (peak qat_lr, warm-up qat_warmup, cosine to base.lr.min_ratio), so that the
//      extra training is not counted as recovery;
//   3. for each recipe, one trainer built with the recipe and given the float weights:
//      PTQ is its evaluation before any step (round-to-nearest: every language-model recipe
//      quantizes dynamically, its qparams derived from the current weights and activations,
//      so there is nothing to calibrate), QAT its evaluation after qat_steps steps on the
//      fine-tune schedule.
// Every fine-tune starts from fresh optimizer moments and continues the float run's crop
// stream from the same point, so all of them see the same crops; every evaluation reads
// the same validation windows (one batch, seq and window cap for every trainer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/lm_trainer.h"

namespace qg::nn {

struct LmCompareConfig {
  LmTrainConfig base;  // the float run (its qconfig is ignored); base.seed is the first seed
  std::vector<std::string> recipes;
  int group_size = 32;
  int64_t qat_steps = 100;
  double qat_lr = 1e-4;
  int64_t qat_warmup = 0;
  int seeds = 1;                 // seeds base.seed, base.seed + 1, ...
  int64_t eval_every = 100;      // steps between evaluations of each run (its last step too)
  std::string init;              // a float LmTrainer checkpoint; empty: train the float model
  std::string float_checkpoint;  // where the first seed's float model goes (empty: nowhere)
  // The token embedding's quantizer in every recipe's PTQ and QAT run (QConfig's fields of
  // the same names; `qat train --embedding-quant`): float by default, as torchao's linear
  // recipes leave it. The float rows never quantize it.
  WeightQuant embedding_weight = WeightQuant::none;
  int embedding_group_size = 32;
  // Learned weight ranges (QConfig::learned_weight_ranges, `qat train --learned-ranges`) in
  // every recipe's run: its PTQ row is the dynamic recipe's (the learned scales start from
  // the float weights' dynamic qparams), its QAT fine-tune learns the scales at
  // base.learned_range_lr_factor times the fine-tune's rate.
  bool learned_weight_ranges = false;
  // The integer forward (QConfig::integer_forward, `qat train --integer-forward`) in every
  // recipe's PTQ evaluation and QAT fine-tune: the deployed integer arithmetic; recipes that
  // do not take it (int4 weight-only) are refused before training.
  bool integer_forward = false;
};

// One recipe under one seed; losses are mean validation cross-entropies (nats per token).
struct LmCompareRun {
  std::string recipe;
  uint64_t seed = 0;
  double float_loss = 0;  // the float reference after the same fine-tune
  double ptq_loss = 0, qat_loss = 0;
  std::vector<LmEvalRecord> history;  // the QAT fine-tune's evaluations
};

struct LmCompareSeed {
  uint64_t seed = 0;
  double pretrained_loss = 0;  // the float model before the fine-tunes
  std::vector<LmEvalRecord> float_history, reference_history;
};

struct LmCompareResult {
  std::vector<LmCompareSeed> seeds;
  std::vector<LmCompareRun> runs;  // seed-major, recipes in the configured order
  double unigram_loss = 0;
  int64_t parameters = 0, windows = 0;
};

// The recipes' QConfigs, checked before anything trains: unknown recipe names (and
// "float", the reference), repeated recipes, group sizes outside the recipes' or that do not
// divide a layer's inputs, and non-positive step counts, rates or seeds are named errors
// (op "train.compare" or the qconfig's and model builder's own).
std::vector<QConfig> validate_lm_compare(const LmCompareConfig& config);

// `log` receives one line per phase and evaluation (may be empty). An `init` checkpoint of
// another architecture or of a quantized recipe is a named error.
LmCompareResult run_lm_compare(const LmCompareConfig& config, const std::vector<int32_t>& train,
                               const std::vector<int32_t>& validation,
                               const std::function<void(const std::string&)>& log = {});

// A recipe's name in tables: with its group size where it has groups ("8da4w g32").
std::string lm_recipe_label(const std::string& recipe, int group_size);

// The table's arithmetic, on perplexities.
// PTQ perplexity losses smaller than this fraction of the float perplexity leave nothing to
// recover: the fraction would be the ratio of two noise-sized differences.
constexpr double kMinRecoverableGap = 0.005;
// (ptq - qat) / (ptq - float); NaN when ptq - float < kMinRecoverableGap * float.
double recovered_fraction(double float_ppl, double ptq_ppl, double qat_ppl);

struct MeanStd {
  double mean = 0, std = 0;  // sample standard deviation (0 for one value)
  int n = 0;                 // the values that were numbers (NaNs are left out)
};
MeanStd mean_std(const std::vector<double>& values);

struct LmCompareRow {
  std::string recipe;
  MeanStd float_ppl, ptq_ppl, qat_ppl, recovered;  // recovered: over the seeds that have one
};
// One row per recipe, in the order of first appearance.
std::vector<LmCompareRow> summarize_lm_compare(const std::vector<LmCompareRun>& runs);

}  // namespace qg::nn
