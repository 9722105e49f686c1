// `qat train --compare`: one table of float32, PTQ and QAT variants of one model kind
// (--model mlp|cnn|transformer). Recipe per seed:
//   1. float32: train `epochs` epochs at `lr` from the seeded init (with --init: from the
//      imported weights, `epochs` defaulting to 0, so the row is the imported model itself);
//   2. PTQ W8A8 / W4A8 / W4A4 (and torchao's 8da4w for transformers): the float weights
//      (batch norms frozen), min/max observers calibrated on the whole training set, then
//      evaluated with fake quantization and as integer weights;
//   3. QAT of the same recipes (plus NF4 for the MLP): the float weights fine-tuned with fake
//      quantization for `qat_epochs` epochs at `qat_lr` (PyTorch's usual
//      prepare_qat-after-pretraining flow), batch norms frozen after half of it.
// The table reports each row's mean (and spread) over `seeds` seeds: one 359-row test set
// moves in steps of 0.28 points, so single runs cannot resolve the 0.5-point targets.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "apps/qat/train_common.h"
#include "train/checkpoint.h"
#include "train/png_plot.h"

namespace qg::cli {
namespace {

struct Stats {
  std::vector<double> fq, integer;
  int64_t bytes = 0;
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  static double stddev(const std::vector<double>& v) {
    if (v.size() < 2) return 0;
    double m = mean(v), s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / static_cast<double>(v.size() - 1));
  }
};

std::string mean_pm(const std::vector<double>& v) {
  char b[48];
  std::snprintf(b, sizeof b, "%.2f%% +- %.2f", 100 * Stats::mean(v), 100 * Stats::stddev(v));
  return b;
}

}  // namespace

void run_compare(const TrainOptions& o) {
  QG_CHECK(o.seeds > 0 && o.qat_epochs >= 0 && o.qat_lr > 0, "train", "--seeds ", o.seeds,
           ", --qat-epochs ", o.qat_epochs, ", --qat-lr ", o.qat_lr, " must be positive");
  auto t0 = std::chrono::steady_clock::now();
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  ensure_dir(o.out);
  nn::QConfig base = qconfig_from(o);
  base.activation = nn::ActQuant::uint8;
  auto with = [&](nn::WeightQuant w, nn::ActQuant a, nn::ObserverKind obs) {
    nn::QConfig q = base;
    q.weight = w;
    q.activation = a;
    q.observer = obs;
    return q;
  };
  struct Recipe {
    std::string name;
    nn::WeightQuant w;
    nn::ActQuant a;
    bool dyn_int4 = false;  // torchao Int8DynActInt4Weight (group-wise int4, per-token int8)
  };
  std::vector<Recipe> recipes = {{"W8A8", nn::WeightQuant::int8, nn::ActQuant::uint8},
                                 {"W4A8", nn::WeightQuant::int4, nn::ActQuant::uint8},
                                 {"W4A4", nn::WeightQuant::int4, nn::ActQuant::uint4},
                                 {"W2A8", nn::WeightQuant::int2, nn::ActQuant::uint8}};
  if (o.model == "transformer")
    recipes.push_back({"8da4w", nn::WeightQuant::int4, nn::ActQuant::int8_dynamic_token, true});
  auto recipe_qconfig = [&](const Recipe& r, nn::ObserverKind obs) {
    if (!r.dyn_int4) return with(r.w, r.a, obs);
    nn::QConfig q = nn::QConfig::int8_dyn_act_int4_weight(32);
    q.observer = obs;
    return q;
  };
  const nn::TrainConfig probe = make_config(o, nn::QConfig::float32());
  std::printf(
      "qat train --compare: %s, batch %d, float %d epochs (%s lr %g), QAT fine-tune %d epochs "
      "(lr %g), %d seeds, %lld train / %lld test rows\n",
      probe.spec().str().c_str(), o.batch, o.epochs, o.optimizer.c_str(), o.lr, o.qat_epochs,
      o.qat_lr, o.seeds, static_cast<long long>(train.size()), static_cast<long long>(test.size()));
  if (!o.init.empty())
    std::printf("float32 row: the weights of %s, fine-tuned %d epochs\n", o.init.c_str(), o.epochs);

  std::vector<std::string> order;
  std::map<std::string, Stats> stats;
  std::vector<Row> curves;  // seed 0's runs, for the PNG
  std::ostringstream csv;
  csv.precision(9);
  csv << "seed,model,test_accuracy,integer_test_accuracy,model_bytes\n";
  auto record = [&](uint64_t seed, const Row& r) {
    if (!stats.count(r.name)) order.push_back(r.name);
    Stats& s = stats[r.name];
    s.fq.push_back(r.fake_quant_acc);
    // Float rows: the converted graph (batch norms folded into the conv biases).
    const double integer = r.integer_acc >= 0 ? r.integer_acc : r.float_integer_acc;
    if (integer >= 0) s.integer.push_back(integer);
    s.bytes = r.bytes;
    if (seed == o.seed) curves.push_back(r);
    csv << seed << ',' << r.name << ',' << r.fake_quant_acc << ','
        << (integer >= 0 ? std::to_string(integer) : "") << ',' << r.bytes << '\n';
    std::printf("  seed %llu  %-9s test %s%s\n", static_cast<unsigned long long>(seed),
                r.name.c_str(), pct(r.fake_quant_acc).c_str(),
                integer >= 0 ? ("  (converted " + pct(integer) + ")").c_str() : "");
    std::fflush(stdout);
  };

  std::string skipped;
  for (int k = 0; k < o.seeds; ++k) {
    TrainOptions so = o;
    so.seed = o.seed + static_cast<uint64_t>(k);
    // 1. float32.
    auto ft = make_trainer(so, nn::QConfig::float32(), train, test);
    if (!o.init.empty()) import_init(o, *ft, k == 0);
    run_training(*ft, so.epochs, "float32", "", 0, false);
    record(so.seed, evaluate_row("float32", *ft, test));
    // 2. PTQ with min/max calibration over the training set (batch norms frozen, so the
    //    calibration passes leave the float model's running statistics alone).
    for (const Recipe& rc : recipes) {
      auto pt = make_trainer(so, recipe_qconfig(rc, nn::ObserverKind::minmax), train, test);
      pt->copy_parameters_from(*ft);
      pt->freeze_batch_norms();
      pt->calibrate(train, static_cast<int>(train.size() / so.batch));
      record(so.seed, evaluate_row("PTQ " + rc.name, *pt, test));
    }
    // 3. QAT fine-tuning of the float weights; batch norms frozen after half of it.
    TrainOptions qo = so;
    qo.lr = o.qat_lr;
    if (qo.freeze_bn_after < 0) qo.freeze_bn_after = train.size() / so.batch * o.qat_epochs / 2;
    std::vector<std::pair<std::string, nn::QConfig>> qat;
    for (const Recipe& rc : recipes)
      qat.emplace_back("QAT " + rc.name, recipe_qconfig(rc, base.observer));
    if (o.model == "mlp")
      qat.emplace_back("QAT NF4", with(nn::WeightQuant::nf4, nn::ActQuant::uint8, base.observer));
    for (const auto& [name, qc] : qat) {
      std::unique_ptr<nn::Trainer> qt;
      try {
        qt = make_trainer(qo, qc, train, test);
      } catch (const Error& e) {  // a build without an op this row needs
        if (k == 0) skipped += name + " skipped: " + e.message() + "\n";
        continue;
      }
      qt->copy_parameters_from(*ft);
      run_training(*qt, qo.qat_epochs, name, "", 0, false);
      record(so.seed, evaluate_row(name, *qt, test));
    }
  }

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s%-10s %22s %24s %10s\n", skipped.c_str(), "model", "test acc (fake-quant)",
              "converted (int weights)", "size (B)");
  std::ostringstream json;
  json.precision(9);
  json << "  \"seeds\": " << o.seeds << ",\n  \"compare\": [\n";
  for (size_t i = 0; i < order.size(); ++i) {
    const Stats& s = stats[order[i]];
    std::printf("%-10s %22s %24s %10lld\n", order[i].c_str(), mean_pm(s.fq).c_str(),
                s.integer.empty() ? "-" : mean_pm(s.integer).c_str(),
                static_cast<long long>(s.bytes));
    json << "    {\"model\": \"" << order[i] << "\", \"test_accuracy_mean\": " << Stats::mean(s.fq)
         << ", \"test_accuracy_std\": " << Stats::stddev(s.fq)
         << ", \"integer_test_accuracy_mean\": " << Stats::mean(s.integer)
         << ", \"model_bytes\": " << s.bytes << "}" << (i + 1 < order.size() ? "," : "") << "\n";
  }
  json << "  ]";
  std::printf("(mean +- standard deviation over %d seeds; %.1f s in all)\n", o.seeds, secs);
  nn::write_file_atomic(o.out + "/compare.csv", csv.str());
  write_metrics(o.out, "metrics",
                curves.empty() ? std::vector<nn::EpochMetrics>{} : curves[0].history, json.str());
  nn::Panel loss{"TRAIN LOSS", {}}, acc{"TEST ACCURACY (PCT)", {}};
  for (const Row& r : curves) {
    if (r.history.empty()) continue;
    // QAT fine-tunes continue from the float run: plot them after its epochs.
    int x0 = r.name.rfind("QAT", 0) == 0 ? o.epochs + 1 : 1;
    nn::Series l{r.name, {}, x0}, a{r.name, {}, x0};
    for (const auto& m : r.history) {
      l.y.push_back(m.train_loss);
      a.y.push_back(100 * m.test_accuracy);
    }
    loss.series.push_back(l);
    acc.series.push_back(a);
  }
  nn::write_plot_png(o.out + "/curves.png", {loss, acc});
  std::printf("wrote %s/compare.csv, metrics.json, metrics.csv, curves.png\n", o.out.c_str());
}

}  // namespace qg::cli
