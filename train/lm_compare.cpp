#include "train/lm_compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "nn/llama.h"

namespace qg::nn {
namespace {

using Log = std::function<void(const std::string&)>;

void say(const Log& log, const std::string& line) {
  if (log) log(line);
}

// Trains `t` to `steps` steps, recording an evaluation every `eval_every` steps and at the
// last one.
void train_recorded(LmTrainer& t, int64_t steps, int64_t eval_every, const std::string& label,
                    const Log& log) {
  const LmTrainConfig& c = t.config();
  double loss_sum = 0;
  int64_t losses = 0;
  auto since = std::chrono::steady_clock::now();
  while (t.step() < steps) {
    loss_sum += t.train_step();
    ++losses;
    const int64_t s = t.step();
    if (s % eval_every != 0 && s != steps) continue;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    const LmEvalRecord& r = t.record(loss_sum / static_cast<double>(losses), secs);
    char line[256];
    std::snprintf(line, sizeof line,
                  "%-26s step %6lld/%lld  train loss %.4f  validation loss %.4f  perplexity %.3f"
                  "  %.0f tokens/s",
                  label.c_str(), static_cast<long long>(s), static_cast<long long>(steps),
                  r.train_loss, r.validation_loss, std::exp(r.validation_loss),
                  secs > 0 ? static_cast<double>(losses * c.batch * c.seq) / secs : 0.0);
    say(log, line);
    loss_sum = 0;
    losses = 0;
    since = std::chrono::steady_clock::now();
  }
}

LmTrainConfig fine_tune_config(const LmCompareConfig& c, uint64_t seed, const QConfig& qc) {
  LmTrainConfig t = c.base;
  t.seed = seed;
  t.qconfig = qc;
  t.lr.peak = c.qat_lr;
  t.lr.warmup = c.qat_warmup;
  t.lr.total = c.qat_steps;
  return t;
}

}  // namespace

std::string lm_recipe_label(const std::string& recipe, int group_size) {
  // w8a8_dynamic's weights are per channel.
  return recipe == "w8a8_dynamic" ? recipe : recipe + " g" + std::to_string(group_size);
}

std::vector<QConfig> validate_lm_compare(const LmCompareConfig& c) {
  QG_CHECK(c.seeds >= 1 && c.qat_steps >= 1 && c.eval_every >= 1, "train.compare", "seeds ",
           c.seeds, ", QAT steps ", c.qat_steps, " and the evaluation interval ", c.eval_every,
           " must be >= 1");
  QG_CHECK(std::isfinite(c.qat_lr) && c.qat_lr > 0, "train.compare", "the QAT learning rate ",
           c.qat_lr, " must be finite and > 0");
  QG_CHECK(c.qat_warmup >= 0, "train.compare", "the QAT warm-up ", c.qat_warmup, " must be >= 0");
  QG_CHECK(!c.recipes.empty(), "train.compare", "no recipe to compare");
  // The fine-tune schedule and the float run's, before any step.
  fine_tune_config(c, c.base.seed, QConfig::float32()).lr.validate();
  if (c.init.empty()) c.base.lr.validate();
  // A one-layer model with a small vocabulary has every kind of linear layer of the
  // configured one (the same inputs per row), so building it names a group size that does
  // not divide a layer as the full model would, without its cost.
  LlamaConfig probe = c.base.model;
  probe.num_hidden_layers = 1;
  probe.vocab_size = std::min<int64_t>(probe.vocab_size, 64);
  std::vector<QConfig> qconfigs;
  for (size_t i = 0; i < c.recipes.size(); ++i) {
    const std::string& r = c.recipes[i];
    QG_CHECK(r != "float", "train.compare",
             "recipe 'float' is the reference of every row; --recipes takes quantized recipes");
    QG_CHECK(std::find(c.recipes.begin(), c.recipes.begin() + static_cast<long>(i), r) ==
                 c.recipes.begin() + static_cast<long>(i),
             "train.compare", "recipe '", r, "' is given twice");
    QConfig qc = parse_recipe(r, c.group_size);
    qc.embedding_weight = c.embedding_weight;
    qc.embedding_group_size = c.embedding_group_size;
    qc.learned_weight_ranges = c.learned_weight_ranges;
    qc.integer_forward = c.integer_forward;
    qc.validate();
    Graph g;
    build_llama(g, probe, 1, 2, qc, c.base.seed);
    qconfigs.push_back(qc);
  }
  return qconfigs;
}

LmCompareResult run_lm_compare(const LmCompareConfig& c, const std::vector<int32_t>& train,
                               const std::vector<int32_t>& validation, const Log& log) {
  const std::vector<QConfig> qconfigs = validate_lm_compare(c);
  LmCompareResult result;
  for (int k = 0; k < c.seeds; ++k) {
    const uint64_t seed = c.base.seed + static_cast<uint64_t>(k);
    const std::string tag = "seed " + std::to_string(seed) + " ";
    LmCompareSeed s;
    s.seed = seed;
    // 1. The float model.
    LmTrainConfig fc = c.base;
    fc.seed = seed;
    fc.qconfig = QConfig::float32();
    LmTrainer f(fc, train, validation);
    if (k == 0) {
      result.unigram_loss = f.unigram_validation_loss();
      result.parameters = f.parameter_count();
      result.windows = f.windows_per_evaluation();
    }
    if (!c.init.empty()) {
      const std::string trained = f.load_parameters(c.init);
      QG_CHECK(trained == QConfig::float32().str(), "train.compare", c.init,
               " was trained with the recipe '", trained,
               "'; the comparison starts from a float model (a checkpoint of `qat train --model "
               "llama` without --recipe)");
      s.pretrained_loss = f.evaluate();
      char line[160];
      std::snprintf(line, sizeof line, "%sfloat: the parameters of %s, validation perplexity %.3f",
                    tag.c_str(), c.init.c_str(), std::exp(s.pretrained_loss));
      say(log, line);
    } else {
      train_recorded(f, fc.lr.total, c.eval_every, tag + "float", log);
      s.pretrained_loss = f.history().back().validation_loss;
      s.float_history = f.history();
      if (k == 0 && !c.float_checkpoint.empty()) f.save_checkpoint(c.float_checkpoint);
    }
    // 2. The float reference: the same fine-tune without quantization.
    double reference_loss = 0;
    {
      LmTrainer r(fine_tune_config(c, seed, QConfig::float32()), train, validation);
      r.copy_parameters_from(f);
      r.continue_crops_from(f);
      train_recorded(r, c.qat_steps, c.eval_every, tag + "float fine-tune", log);
      reference_loss = r.history().back().validation_loss;
      s.reference_history = r.history();
    }
    // 3. PTQ and QAT of each recipe, from the same float weights and crops.
    for (size_t i = 0; i < c.recipes.size(); ++i) {
      const std::string label = lm_recipe_label(c.recipes[i], c.group_size);
      LmTrainer q(fine_tune_config(c, seed, qconfigs[i]), train, validation);
      q.copy_parameters_from(f);
      q.continue_crops_from(f);
      LmCompareRun run;
      run.recipe = c.recipes[i];
      run.seed = seed;
      run.float_loss = reference_loss;
      run.ptq_loss = q.evaluate();
      char line[160];
      std::snprintf(line, sizeof line, "%s%s PTQ: validation perplexity %.3f", tag.c_str(),
                    label.c_str(), std::exp(run.ptq_loss));
      say(log, line);
      train_recorded(q, c.qat_steps, c.eval_every, tag + label + " QAT", log);
      run.qat_loss = q.history().back().validation_loss;
      run.history = q.history();
      result.runs.push_back(run);
    }
    result.seeds.push_back(s);
  }
  return result;
}

double recovered_fraction(double float_ppl, double ptq_ppl, double qat_ppl) {
  const double gap = ptq_ppl - float_ppl;
  if (!(gap >= kMinRecoverableGap * float_ppl)) return std::nan("");
  return (ptq_ppl - qat_ppl) / gap;
}

MeanStd mean_std(const std::vector<double>& values) {
  MeanStd m;
  double sum = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    ++m.n;
  }
  if (m.n == 0) {
    m.mean = std::nan("");
    return m;
  }
  m.mean = sum / m.n;
  if (m.n < 2) return m;
  double ss = 0;
  for (double v : values)
    if (!std::isnan(v)) ss += (v - m.mean) * (v - m.mean);
  m.std = std::sqrt(ss / (m.n - 1));
  return m;
}

std::vector<LmCompareRow> summarize_lm_compare(const std::vector<LmCompareRun>& runs) {
  std::vector<std::string> order;
  for (const LmCompareRun& r : runs)
    if (std::find(order.begin(), order.end(), r.recipe) == order.end()) order.push_back(r.recipe);
  std::vector<LmCompareRow> rows;
  for (const std::string& recipe : order) {
    std::vector<double> fl, ptq, qat, rec;
    for (const LmCompareRun& r : runs) {
      if (r.recipe != recipe) continue;
      fl.push_back(std::exp(r.float_loss));
      ptq.push_back(std::exp(r.ptq_loss));
      qat.push_back(std::exp(r.qat_loss));
      rec.push_back(recovered_fraction(fl.back(), ptq.back(), qat.back()));
    }
    rows.push_back({recipe, mean_std(fl), mean_std(ptq), mean_std(qat), mean_std(rec)});
  }
  return rows;
}

}  // namespace qg::nn
