// `qat train --model llama --compare`: float, PTQ and QAT perplexities of the Llama decoder
// under each QAT recipe of --recipes (nn::run_lm_compare, train/lm_compare.h, says how each
// row is made), as one table: the float reference after the same fine-tune, PTQ
// (round-to-nearest), QAT, and the fraction of the PTQ perplexity loss that QAT recovers,
// mean +- standard deviation over --seeds seeds. Writes compare.csv (one line per seed and
// recipe), compare.json (the table and every run) and curves.png (the fine-tunes' validation
// perplexity, first seed) to --out, and the first seed's float model to float.qgck (a
// later --init takes it).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "apps/qat/train_common.h"
#include "core/error.h"
#include "data/text_corpus.h"
#include "data/token_data.h"
#include "nn/llama_config.h"
#include "nn/llama_embedding.h"
#include "train/checkpoint.h"
#include "train/lm_compare.h"
#include "train/png_plot.h"

namespace qg::cli {
namespace {

const std::vector<std::string> kDefaultRecipes = {"8da4w", "int4_weight_only", "w8a8_dynamic",
                                                  "8da3w", "8da2w"};

std::string with_spread(const nn::MeanStd& m, int seeds, const char* format) {
  char b[64];
  std::snprintf(b, sizeof b, format, m.mean);
  std::string s = b;
  if (seeds > 1) {
    std::snprintf(b, sizeof b, format, m.std);
    s += std::string(" +- ") + b;
  }
  return s;
}

std::string recovered_text(const nn::MeanStd& r, int seeds) {
  if (r.n == 0) return "n/a";
  nn::MeanStd pct = r;
  pct.mean *= 100;
  pct.std *= 100;
  std::string s = with_spread(pct, seeds, "%.1f") + "%";
  if (r.n < seeds) s += " (" + std::to_string(r.n) + " of " + std::to_string(seeds) + " seeds)";
  return s;
}

// JSON numbers: NaN (a recovered fraction that does not exist) is null.
std::string num(double v) {
  if (std::isnan(v)) return "null";
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

void write_outputs(const TrainOptions& o, const nn::LmCompareConfig& c,
                   const nn::LmCompareResult& r, const std::vector<nn::LmCompareRow>& rows) {
  std::ostringstream csv;
  csv.precision(9);
  csv << "seed,recipe,group_size,float_perplexity,ptq_perplexity,qat_perplexity,"
         "recovered_fraction,pretrained_float_perplexity\n";
  for (const nn::LmCompareRun& run : r.runs) {
    double pretrained = 0;
    for (const nn::LmCompareSeed& s : r.seeds)
      if (s.seed == run.seed) pretrained = std::exp(s.pretrained_loss);
    const double f = std::exp(run.float_loss), p = std::exp(run.ptq_loss),
                 q = std::exp(run.qat_loss), rec = nn::recovered_fraction(f, p, q);
    csv << run.seed << ',' << run.recipe << ',' << c.group_size << ',' << f << ',' << p << ',' << q
        << ',' << (std::isnan(rec) ? "" : num(rec)) << ',' << pretrained << '\n';
  }
  nn::write_file_atomic(o.out + "/compare.csv", csv.str());

  std::ostringstream js;
  js << "{\n  \"seeds\": " << o.seeds << ",\n  \"first_seed\": " << o.seed
     << ",\n  \"steps\": " << (o.init.empty() ? o.steps : 0) << ",\n  \"init\": \""
     << json_escape(o.init) << "\",\n  \"qat_steps\": " << c.qat_steps
     << ",\n  \"qat_lr\": " << num(c.qat_lr) << ",\n  \"qat_warmup\": " << c.qat_warmup
     << ",\n  \"group_size\": " << c.group_size << ",\n  \"embedding_quant\": \""
     << json_escape(o.embedding_quant)
     << "\",\n  \"embedding_group_size\": " << c.embedding_group_size
     << ",\n  \"learned_weight_ranges\": " << (c.learned_weight_ranges ? "true" : "false")
     << ",\n  \"integer_forward\": " << (c.integer_forward ? "true" : "false")
     << ",\n  \"parameters\": " << r.parameters << ",\n  \"validation_windows\": " << r.windows
     << ",\n  \"unigram_perplexity\": " << num(std::exp(r.unigram_loss))
     << ",\n  \"min_recoverable_gap\": " << num(nn::kMinRecoverableGap) << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const nn::LmCompareRow& w = rows[i];
    js << "    {\"recipe\": \"" << w.recipe << "\", \"float_perplexity\": " << num(w.float_ppl.mean)
       << ", \"float_perplexity_std\": " << num(w.float_ppl.std)
       << ", \"ptq_perplexity\": " << num(w.ptq_ppl.mean)
       << ", \"ptq_perplexity_std\": " << num(w.ptq_ppl.std)
       << ", \"qat_perplexity\": " << num(w.qat_ppl.mean)
       << ", \"qat_perplexity_std\": " << num(w.qat_ppl.std)
       << ", \"recovered_fraction\": " << num(w.recovered.mean)
       << ", \"recovered_fraction_std\": " << num(w.recovered.n > 0 ? w.recovered.std : NAN)
       << ", \"recovered_seeds\": " << w.recovered.n << "}" << (i + 1 < rows.size() ? "," : "")
       << "\n";
  }
  js << "  ],\n  \"pretrained\": [\n";
  for (size_t i = 0; i < r.seeds.size(); ++i)
    js << "    {\"seed\": " << r.seeds[i].seed << ", \"loss\": " << num(r.seeds[i].pretrained_loss)
       << "}" << (i + 1 < r.seeds.size() ? "," : "") << "\n";
  js << "  ],\n  \"runs\": [\n";
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const nn::LmCompareRun& run = r.runs[i];
    js << "    {\"seed\": " << run.seed << ", \"recipe\": \"" << run.recipe
       << "\", \"float_loss\": " << num(run.float_loss) << ", \"ptq_loss\": " << num(run.ptq_loss)
       << ", \"qat_loss\": " << num(run.qat_loss) << "}" << (i + 1 < r.runs.size() ? "," : "")
       << "\n";
  }
  js << "  ]\n}\n";
  nn::write_file_atomic(o.out + "/compare.json", js.str());

  // The first seed's fine-tunes, each from its start (the float model, or PTQ) on.
  const nn::LmCompareSeed& s0 = r.seeds.front();
  auto series = [](std::string name, double start, const std::vector<nn::LmEvalRecord>& h) {
    for (char& ch : name) ch = ch == '_' ? ' ' : static_cast<char>(std::toupper(ch));
    nn::Series s{name, {std::exp(start)}, 0};
    for (const nn::LmEvalRecord& e : h) s.y.push_back(std::exp(e.validation_loss));
    return s;
  };
  const std::string x = "EVALUATION EVERY " + std::to_string(c.eval_every) + " STEPS";
  nn::Panel fine{
      "FINE-TUNE PERPLEXITY", {series("float", s0.pretrained_loss, s0.reference_history)}, x};
  for (const nn::LmCompareRun& run : r.runs)
    if (run.seed == s0.seed)
      fine.series.push_back(
          series(nn::lm_recipe_label(run.recipe, c.group_size), run.ptq_loss, run.history));
  std::vector<nn::Panel> panels = {fine};
  if (!s0.float_history.empty()) {
    nn::Series f = series("float", 0, s0.float_history);
    f.y.erase(f.y.begin());
    f.x0 = 1;
    panels.insert(panels.begin(), nn::Panel{"FLOAT PERPLEXITY", {f}, x});
  }
  nn::write_plot_png(o.out + "/curves.png", panels);
}

}  // namespace

void run_llama_compare(const TrainOptions& o) {
  QG_CHECK(!o.llama_config.empty() && !o.data.empty(), "train",
           "--model llama --compare needs --config (a Hugging Face config.json) and --data DIR");
  nn::LmCompareConfig c;
  c.base = llama_train_config(o, nn::load_llama_config(o.llama_config));
  c.recipes = o.recipes.empty() ? kDefaultRecipes : o.recipes;
  c.group_size = o.group_size;
  c.embedding_weight = nn::parse_embedding_quant(o.embedding_quant);
  c.embedding_group_size = o.embedding_group_size;
  c.learned_weight_ranges = o.learned_ranges;
  c.integer_forward = o.integer_forward;
  c.qat_steps = o.qat_steps;
  c.qat_lr = o.qat_lr;
  c.qat_warmup = std::min<int64_t>(o.warmup, o.qat_steps / 10);
  c.seeds = o.seeds;
  c.eval_every = o.eval_every;
  c.init = o.init;
  c.float_checkpoint = o.init.empty() ? o.out + "/float.qgck" : "";
  // Bad recipes, group sizes and step counts fail here, before the corpus is read.
  nn::validate_lm_compare(c);
  QG_CHECK(o.init.empty() || o.resume.empty(), "train", "--init '", o.init, "' and --resume '",
           o.resume,
           "': --compare starts from --init or trains its float model; it resumes nothing");

  const std::string corpus = o.corpus.empty() ? nn::default_text_corpus_dir() : o.corpus;
  nn::TokenData data =
      nn::prepare_token_data(corpus, o.data, c.base.model.vocab_size, [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      });
  ensure_dir(o.out);
  std::string recipes;
  for (const std::string& r : c.recipes)
    recipes += (recipes.empty() ? "" : ", ") + nn::lm_recipe_label(r, c.group_size);
  if (c.learned_weight_ranges) recipes += " (learned weight ranges)";
  if (c.integer_forward) recipes += " (integer forward)";
  if (c.embedding_weight != nn::WeightQuant::none)
    recipes += " (each with its token embedding quantized: " + o.embedding_quant + ", group " +
               std::to_string(c.embedding_group_size) + ")";
  std::printf(
      "qat train --model llama --compare: %s; float %s; fine-tunes of %lld steps at peak lr %g "
      "(warm-up %lld, cosine to %g x); batch %lld x %lld tokens; %d seed(s) from %llu; %s; "
      "%lld training / %lld validation tokens\n",
      recipes.c_str(),
      o.init.empty() ? ("trained " + std::to_string(o.steps) + " steps").c_str()
                     : ("from " + o.init).c_str(),
      static_cast<long long>(c.qat_steps), c.qat_lr, static_cast<long long>(c.qat_warmup),
      o.min_lr_ratio, static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.seeds,
      static_cast<unsigned long long>(o.seed), c.base.device.str().c_str(),
      static_cast<long long>(data.train.size()), static_cast<long long>(data.validation.size()));
  std::fflush(stdout);

  const nn::LmCompareResult r =
      nn::run_lm_compare(c, data.train, data.validation, [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      });
  const std::vector<nn::LmCompareRow> rows = nn::summarize_lm_compare(r.runs);
  std::vector<double> pretrained;
  for (const nn::LmCompareSeed& s : r.seeds) pretrained.push_back(std::exp(s.pretrained_loss));
  std::printf(
      "\nvalidation perplexity, %lld windows of %lld tokens (unigram %.2f; float before the "
      "fine-tunes %s)\n",
      static_cast<long long>(r.windows), static_cast<long long>(o.seq), std::exp(r.unigram_loss),
      with_spread(nn::mean_std(pretrained), o.seeds, "%.3f").c_str());
  std::printf("%-22s %18s %18s %18s %22s\n", "recipe", "float (fine-tuned)", "PTQ", "QAT",
              "recovered");
  for (const nn::LmCompareRow& w : rows)
    std::printf("%-22s %18s %18s %18s %22s\n", nn::lm_recipe_label(w.recipe, c.group_size).c_str(),
                with_spread(w.float_ppl, o.seeds, "%.3f").c_str(),
                with_spread(w.ptq_ppl, o.seeds, "%.3f").c_str(),
                with_spread(w.qat_ppl, o.seeds, "%.3f").c_str(),
                recovered_text(w.recovered, o.seeds).c_str());
  std::printf(
      "recovered = (PTQ - QAT) / (PTQ - float) of the perplexity; n/a where PTQ is within "
      "%.1f%% of float%s\n",
      100 * nn::kMinRecoverableGap, o.seeds > 1 ? "; mean +- standard deviation over seeds" : "");
  write_outputs(o, c, r, rows);
  std::printf("wrote %s/compare.csv, compare.json, curves.png%s\n", o.out.c_str(),
              c.float_checkpoint.empty() ? "" : ", float.qgck");
}

}  // namespace qg::cli
