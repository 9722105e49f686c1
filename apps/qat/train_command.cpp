// `qat train`: end-to-end QAT of an MLP on the UCI digits data. One configuration trains
// with a live progress display and writes metrics (JSON, CSV), loss/accuracy curves (PNG),
// checkpoints, and the accuracy of the converted integer-weight model. `--compare` trains
// float32, PTQ and QAT variants and prints one table.
#include <cstdio>
#include <sstream>

#include "apps/qat/commands.h"
#include "apps/qat/train_common.h"
#include "nn/checkpoint.h"
#include "nn/png_plot.h"
#include "nn/quantized.h"

namespace qg::cli {
namespace {

nn::QConfig qconfig_from(const TrainOptions& o) {
  nn::QConfig qc;
  qc.weight = nn::parse_weight_quant(o.weight_bits);
  qc.activation = nn::parse_act_quant(o.act_bits);
  qc.observer = nn::parse_observer(o.observer);
  qc.weight_scope = o.scope;
  return qc;
}

struct Row {
  std::string name;
  double fake_quant_acc = 0, integer_acc = -1;
  int64_t bytes = 0;
  std::vector<nn::EpochMetrics> history;
};

std::string pct(double a) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * a);
  return b;
}

Row evaluate_row(const std::string& name, nn::Trainer& t, const nn::Dataset& test) {
  Row r;
  r.name = name;
  r.fake_quant_acc = t.evaluate(test);
  nn::QuantizedMlp q = nn::convert_to_quantized(t.executor(), t.model().layers,
                                                t.model().input_observer, t.config().qconfig);
  r.bytes = q.size_bytes();
  if (t.config().qconfig.quantized()) r.integer_acc = q.accuracy(test);
  r.history = t.history();
  return r;
}

void run_single(const TrainOptions& o) {
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  nn::QConfig qc = qconfig_from(o);
  auto t = make_trainer(o, qc, train, test);
  ensure_dir(o.out);
  if (!o.resume.empty()) {
    t->load_checkpoint(o.resume);
    std::printf("resumed from %s at epoch %d (step %lld)\n", o.resume.c_str(), t->epoch(),
                static_cast<long long>(t->step()));
  }
  std::printf("qat train: %s, MLP 64-%dx%d-10, %s lr %g, batch %d, %d epochs, seed %llu, %s\n",
              qc.str().c_str(), o.width, o.depth, o.optimizer.c_str(), o.lr, o.batch, o.epochs,
              static_cast<unsigned long long>(o.seed), t->executor().device().str().c_str());
  std::printf("data: %lld train / %lld test rows\n", static_cast<long long>(train.size()),
              static_cast<long long>(test.size()));
  run_training(*t, o.epochs, qc.quantized() ? "qat" : "float", o.out + "/checkpoint.qgck",
               o.checkpoint_every);
  Row r = evaluate_row(qc.str(), *t, test);
  std::printf("test accuracy (fake-quant graph): %s\n", pct(r.fake_quant_acc).c_str());
  if (r.integer_acc >= 0)
    std::printf(
        "test accuracy (integer weights, dequantize on the fly): %s  (difference %+.2f points)\n",
        pct(r.integer_acc).c_str(), 100 * (r.integer_acc - r.fake_quant_acc));
  std::printf("model size: %lld bytes\n", static_cast<long long>(r.bytes));
  std::ostringstream extra;
  extra.precision(9);
  extra << "  \"config\": \"" << json_escape(qc.str()) << "\",\n  \"seed\": " << o.seed
        << ",\n  \"test_accuracy\": " << r.fake_quant_acc
        << ",\n  \"integer_test_accuracy\": " << (r.integer_acc >= 0 ? r.integer_acc : 0.0)
        << ",\n  \"model_bytes\": " << r.bytes;
  write_metrics(o.out, "metrics", r.history, extra.str());
  std::vector<double> loss, acc, train_acc;
  for (const auto& m : r.history) {
    loss.push_back(m.train_loss);
    acc.push_back(100 * m.test_accuracy);
    train_acc.push_back(100 * m.train_accuracy);
  }
  nn::write_plot_png(
      o.out + "/curves.png",
      {{"LOSS", {{"TRAIN", loss}}}, {"ACCURACY %", {{"TRAIN", train_acc}, {"TEST", acc}}}});
  std::printf("wrote %s/metrics.json, metrics.csv, curves.png\n", o.out.c_str());
}

void run_compare(const TrainOptions& o) {
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  ensure_dir(o.out);
  std::vector<Row> rows;
  nn::QConfig fp = nn::QConfig::float32();
  auto base = nn::QConfig::w8a8();
  base.observer = nn::parse_observer(o.observer);
  base.weight_scope = o.scope;
  auto with_weight = [&](nn::WeightQuant w) {
    nn::QConfig q = base;
    q.weight = w;
    return q;
  };

  // 1. float32.
  auto ft = make_trainer(o, fp, train, test);
  run_training(*ft, o.epochs, "float32", "", 0);
  rows.push_back(evaluate_row("float32", *ft, test));
  // 2. PTQ: the float weights, observers calibrated on the training data, no retraining.
  for (auto w : {nn::WeightQuant::int8, nn::WeightQuant::int4}) {
    auto pt = make_trainer(o, with_weight(w), train, test);
    pt->copy_parameters_from(*ft);
    pt->calibrate(train, static_cast<int>(train.size() / o.batch));
    rows.push_back(evaluate_row(w == nn::WeightQuant::int8 ? "PTQ W8A8" : "PTQ W4A8", *pt, test));
  }
  // 3. QAT from scratch with the same recipe.
  const std::pair<const char*, nn::WeightQuant> qat[] = {{"QAT W8A8", nn::WeightQuant::int8},
                                                         {"QAT W4A8", nn::WeightQuant::int4},
                                                         {"QAT NF4", nn::WeightQuant::nf4}};
  for (const auto& [name, w] : qat) {
    try {
      auto qt = make_trainer(o, with_weight(w), train, test);
      run_training(*qt, o.epochs, name, "", 0);
      rows.push_back(evaluate_row(name, *qt, test));
    } catch (const Error& e) {  // e.g. a build without the NF4 fake-quant op
      std::printf("%s skipped: %s\n", name, e.message().c_str());
    }
  }

  std::printf("\n%-10s %22s %24s %12s\n", "model", "test acc (fake-quant)",
              "test acc (int weights)", "size (B)");
  std::ostringstream csv, json;
  csv << "model,test_accuracy,integer_test_accuracy,model_bytes\n";
  json.precision(9);
  json << "  \"compare\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%-10s %22s %24s %12lld\n", r.name.c_str(), pct(r.fake_quant_acc).c_str(),
                r.integer_acc >= 0 ? pct(r.integer_acc).c_str() : "-",
                static_cast<long long>(r.bytes));
    csv << r.name << ',' << r.fake_quant_acc << ','
        << (r.integer_acc >= 0 ? std::to_string(r.integer_acc) : "") << ',' << r.bytes << '\n';
    json << "    {\"model\": \"" << r.name << "\", \"test_accuracy\": " << r.fake_quant_acc
         << ", \"integer_test_accuracy\": " << (r.integer_acc >= 0 ? r.integer_acc : 0.0)
         << ", \"model_bytes\": " << r.bytes << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  json << "  ]";
  nn::write_file_atomic(o.out + "/compare.csv", csv.str());
  write_metrics(o.out, "metrics", rows[0].history, json.str());
  nn::Panel loss{"LOSS", {}}, acc{"TEST ACCURACY %", {}};
  for (const Row& r : rows) {
    if (r.history.empty() || r.name.rfind("PTQ", 0) == 0) continue;
    nn::Series l{r.name, {}}, a{r.name, {}};
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

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a QAT MLP on the UCI digits data");
  auto o = std::make_shared<TrainOptions>();
  cmd->add_option("--width", o->width, "Hidden layer width")->capture_default_str();
  cmd->add_option("--depth", o->depth, "Number of hidden layers")->capture_default_str();
  cmd->add_option("--weight-bits", o->weight_bits, "Weights: 32, 8, 4 or nf4")
      ->capture_default_str();
  cmd->add_option("--act-bits", o->act_bits, "Activations: 32 or 8")->capture_default_str();
  cmd->add_option("--scope", o->scope, "Weight qparams: channel or tensor")->capture_default_str();
  cmd->add_option("--observer", o->observer, "moving_average or minmax")->capture_default_str();
  cmd->add_option("--optimizer", o->optimizer, "adam or sgd")->capture_default_str();
  cmd->add_option("--lr", o->lr, "Learning rate")->capture_default_str();
  cmd->add_option("--epochs", o->epochs, "Epochs")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Batch size")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for init and data order")->capture_default_str();
  cmd->add_option("--device", o->device, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--out", o->out, "Output directory")->capture_default_str();
  cmd->add_option("--data", o->data,
                  "digits.csv.gz (default: $QG_DIGITS_CSV, then python3-sklearn's copy)");
  cmd->add_option("--resume", o->resume, "Resume from a checkpoint file");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Save <out>/checkpoint.qgck every N epochs (0: never)")
      ->capture_default_str();
  cmd->add_flag("--compare", o->compare, "Train float32, PTQ and QAT variants; print one table");
  cmd->callback([o] {
    if (o->compare)
      run_compare(*o);
    else
      run_single(*o);
  });
}

}  // namespace qg::cli
