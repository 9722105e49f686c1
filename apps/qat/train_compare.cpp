// `qat train --compare`: one table of float32, PTQ and QAT variants of the digits MLP.
// Recipe per seed:
//   1. float32: train `epochs` epochs at `lr` from the seeded init;
//   2. PTQ W8A8 / W4A8: the float weights, min/max observers calibrated on the whole
//      training set, then evaluated with fake quantization and as integer weights;
//   3. QAT W8A8 / W4A8 / NF4: the float weights fine-tuned with fake quantization for
//      `qat_epochs` epochs at `qat_lr` (PyTorch's usual prepare_qat-after-pretraining flow).
// The table reports each row's mean (and spread) over `seeds` seeds: one 359-row test set
// moves in steps of 0.28 points, so single runs cannot resolve the 0.5-point targets.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "apps/qat/train_common.h"
#include "nn/checkpoint.h"
#include "nn/png_plot.h"

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
  auto with = [&](nn::WeightQuant w, nn::ObserverKind obs) {
    nn::QConfig q = base;
    q.weight = w;
    q.observer = obs;
    return q;
  };
  std::printf(
      "qat train --compare: MLP 64-%dx%d-10, batch %d, float %d epochs (%s lr %g), "
      "QAT fine-tune %d epochs (lr %g), %d seeds, %lld train / %lld test rows\n",
      o.width, o.depth, o.batch, o.epochs, o.optimizer.c_str(), o.lr, o.qat_epochs, o.qat_lr,
      o.seeds, static_cast<long long>(train.size()), static_cast<long long>(test.size()));

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
    if (r.integer_acc >= 0) s.integer.push_back(r.integer_acc);
    s.bytes = r.bytes;
    if (seed == o.seed) curves.push_back(r);
    csv << seed << ',' << r.name << ',' << r.fake_quant_acc << ','
        << (r.integer_acc >= 0 ? std::to_string(r.integer_acc) : "") << ',' << r.bytes << '\n';
    std::printf(
        "  seed %llu  %-9s test %s%s\n", static_cast<unsigned long long>(seed), r.name.c_str(),
        pct(r.fake_quant_acc).c_str(),
        r.integer_acc >= 0 ? ("  (integer weights " + pct(r.integer_acc) + ")").c_str() : "");
    std::fflush(stdout);
  };

  std::string skipped;
  for (int k = 0; k < o.seeds; ++k) {
    TrainOptions so = o;
    so.seed = o.seed + static_cast<uint64_t>(k);
    // 1. float32.
    auto ft = make_trainer(so, nn::QConfig::float32(), train, test);
    run_training(*ft, so.epochs, "float32", "", 0, false);
    record(so.seed, evaluate_row("float32", *ft, test));
    // 2. PTQ with min/max calibration over the training set.
    for (auto w : {nn::WeightQuant::int8, nn::WeightQuant::int4}) {
      auto pt = make_trainer(so, with(w, nn::ObserverKind::minmax), train, test);
      pt->copy_parameters_from(*ft);
      pt->calibrate(train, static_cast<int>(train.size() / so.batch));
      record(so.seed,
             evaluate_row(w == nn::WeightQuant::int8 ? "PTQ W8A8" : "PTQ W4A8", *pt, test));
    }
    // 3. QAT fine-tuning of the float weights.
    TrainOptions qo = so;
    qo.lr = o.qat_lr;
    const std::pair<const char*, nn::WeightQuant> qat[] = {{"QAT W8A8", nn::WeightQuant::int8},
                                                           {"QAT W4A8", nn::WeightQuant::int4},
                                                           {"QAT NF4", nn::WeightQuant::nf4}};
    for (const auto& [name, w] : qat) {
      std::unique_ptr<nn::Trainer> qt;
      try {
        qt = make_trainer(qo, with(w, base.observer), train, test);
      } catch (const Error& e) {  // a build without an op this row needs
        if (k == 0) skipped += std::string(name) + " skipped: " + e.message() + "\n";
        continue;
      }
      qt->copy_parameters_from(*ft);
      run_training(*qt, qo.qat_epochs, name, "", 0, false);
      record(so.seed, evaluate_row(name, *qt, test));
    }
  }

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s%-10s %22s %24s %10s\n", skipped.c_str(), "model", "test acc (fake-quant)",
              "test acc (int weights)", "size (B)");
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
