#include "apps/qat/train_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "nn/import_weights.h"
#include "nn/llama_embedding.h"
#include "nn/quantized.h"
#include "runtime/backend.h"
#include "runtime/distributed/launch.h"
#include "train/checkpoint.h"
#include "train/png_plot.h"

namespace qg::cli {

nn::TrainConfig make_config(const TrainOptions& o, const nn::QConfig& qc) {
  QG_CHECK(o.width > 0 && o.depth >= 0 && o.batch > 0 && o.epochs >= 0, "train", "width ", o.width,
           ", depth ", o.depth, ", batch ", o.batch, ", epochs ", o.epochs,
           ": width and batch must be > 0, depth and epochs >= 0");
  const auto& kinds = nn::model_kinds();
  QG_CHECK(std::find(kinds.begin(), kinds.end(), o.model) != kinds.end(), "train", "--model '",
           o.model, "' is not one of mlp, cnn, transformer");
  nn::TrainConfig c;
  c.model = o.model;
  c.cnn.channels = o.channels;
  c.transformer.d_model = o.d_model;
  c.transformer.heads = o.heads;
  c.transformer.layers = o.blocks;
  c.transformer.mlp_hidden = 2 * o.d_model;
  c.freeze_bn_after = o.freeze_bn_after;
  c.mlp.hidden.assign(static_cast<size_t>(o.depth), o.width);
  c.mlp.batch = o.batch;
  c.drop_last = !o.keep_last;
  c.qconfig = qc;
  c.optimizer.kind = o.optimizer;
  c.optimizer.lr = o.lr;
  c.seed = o.seed;
  c.comm = o.comm;
  c.sync_observers = !o.no_sync_observers;
  c.sync_batch_norm = !o.no_sync_bn;
  c.shard_optimizer_states = o.zero1;
  c.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
  QG_CHECK(c.bucket_bytes > 0, "train", "--bucket-mb ", o.bucket_mb, " must be > 0");
  c.grad_reduce_dtype = dtype_from_name(o.grad_reduce_dtype);
  return c;
}

std::unique_ptr<nn::Trainer> make_trainer(const TrainOptions& o, const nn::QConfig& qc,
                                          const nn::Dataset& train, const nn::Dataset& test) {
  nn::TrainConfig c = make_config(o, qc);
  QG_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "train", "device '",
           o.device, "' is not one of auto, cpu, cuda");
  if (o.device == "cpu" || (o.device == "auto" && !cuda_available()))
    return std::make_unique<nn::Trainer>(c, train, test);
  c.device = Device::cuda(o.local_rank);
  if (o.device == "cuda") return std::make_unique<nn::Trainer>(c, train, test);
  try {
    return std::make_unique<nn::Trainer>(c, train, test);
  } catch (const Error& e) {
    std::fprintf(stderr, "note: --device auto falls back to the CPU: %s\n", e.message().c_str());
    c.device = Device::cpu();
    return std::make_unique<nn::Trainer>(c, train, test);
  }
}

void apply_model_defaults(TrainOptions& o, const std::function<bool(const char*)>& given) {
  const auto& kinds = nn::model_kinds();
  QG_CHECK(std::find(kinds.begin(), kinds.end(), o.model) != kinds.end(), "train", "--model '",
           o.model, "' is not one of mlp, cnn, transformer, llama");
  struct Defaults {
    int epochs, qat_epochs;
    double lr, qat_lr;
  };
  // Measured on the digits data (README): enough epochs to converge, QAT fine-tunes long
  // enough to recover the low-bit rows, two CPU cores in well under a minute per --compare.
  Defaults d{o.epochs, o.qat_epochs, o.lr, o.qat_lr};
  if (o.model == "cnn") d = {12, 3, 1e-2, 3e-4};
  if (o.model == "transformer") d = {15, 4, 3e-3, 5e-4};
  if (!given("--epochs")) o.epochs = d.epochs;
  if (!given("--qat-epochs")) o.qat_epochs = d.qat_epochs;
  if (!given("--lr")) o.lr = d.lr;
  if (!given("--qat-lr")) o.qat_lr = d.qat_lr;
  QG_CHECK(!o.compare || o.save_logits.empty(), "train",
           "--save-logits is for single runs, not --compare");
  if (o.init.empty()) return;
  QG_CHECK(o.resume.empty(), "train", "--init '", o.init, "' and --resume '", o.resume,
           "' both set the starting weights; give one");
  // Imported weights are already trained: --compare evaluates them as they are (its float
  // row; PTQ calibrates them, QAT fine-tunes them), and a single run fine-tunes them with the
  // QAT fine-tuning schedule.
  if (o.compare) {
    if (!given("--epochs")) o.epochs = 0;
    return;
  }
  if (!given("--epochs")) o.epochs = o.qat_epochs;
  if (!given("--lr")) o.lr = o.qat_lr;
  // No training: a quantized recipe is post-training quantization, calibrated by min/max
  // observers as --compare's PTQ rows are (moving averages at 0.01 barely move in one pass).
  if (o.epochs == 0 && !given("--observer")) o.observer = "minmax";
}

void import_init(const TrainOptions& o, nn::Trainer& t, bool verbose) {
  std::map<std::string, std::string> table;
  for (const std::string& m : o.init_map) {
    const size_t eq = m.find('=');
    QG_CHECK(eq != std::string::npos && eq > 0, "train", "--init-map '", m,
             "' is not FILE_NAME=MODEL_NAME (MODEL_NAME empty to ignore FILE_NAME)");
    QG_CHECK(table.emplace(m.substr(0, eq), m.substr(eq + 1)).second, "train", "--init-map names '",
             m.substr(0, eq), "' twice");
  }
  nn::ImportReport r = nn::import_weights_file(t.executor(), o.init, nn::name_table(table));
  if (verbose) std::printf("%s: %s\n", o.init.c_str(), r.summary().c_str());
}

void add_model_options(CLI::App* cmd, TrainOptions& o) {
  cmd->add_option("--model", o.model, "Model: mlp, cnn or transformer (train: also llama)")
      ->capture_default_str();
  cmd->add_option("--channels", o.channels, "cnn: channels of its three conv-bn layers")
      ->capture_default_str()
      ->expected(3);
  cmd->add_option("--d-model", o.d_model, "transformer: model width")->capture_default_str();
  cmd->add_option("--heads", o.heads, "transformer: attention heads")->capture_default_str();
  cmd->add_option("--blocks", o.blocks, "transformer: blocks")->capture_default_str();
  cmd->add_option("--freeze-bn-after", o.freeze_bn_after,
                  "Freeze batch-norm statistics after N optimizer steps (-1: never; --compare "
                  "QAT: half the fine-tuning)")
      ->capture_default_str();
  cmd->add_option("--width", o.width, "Hidden layer width")->capture_default_str();
  cmd->add_option("--depth", o.depth, "Number of hidden layers")->capture_default_str();
  cmd->add_option("--weight-bits", o.weight_bits, "Weights: 32, 8, 4, 2 or nf4")
      ->capture_default_str();
  cmd->add_option("--act-bits", o.act_bits,
                  "Activations: 32, 8, 4 (static per tensor) or dyn8 (per-token dynamic int8)")
      ->capture_default_str();
  cmd->add_option("--scope", o.scope, "Weight qparams: channel, tensor or group (of --group-size)")
      ->capture_default_str();
  cmd->add_option("--group-size", o.group_size, "Weights per qparam for --scope group")
      ->capture_default_str();
  cmd->add_option("--observer", o.observer, "moving_average or minmax")->capture_default_str();
  cmd->add_option("--recipe", o.recipe,
                  "A language-model QAT recipe with torchao's numerics: 8da4w, 8da3w, 8da2w, "
                  "int4_weight_only, w8a8_dynamic or float (overrides --weight-bits, --act-bits "
                  "and --scope; group-wise ones take --group-size: 32, 64, 128 or 256)");
  cmd->add_flag("--learned-ranges", o.learned_ranges,
                "llama: learn the weight scales of a dynamic recipe (8da4w, 8da3w, 8da2w, "
                "w8a8_dynamic) as parameters, torchao's range learning, starting from the "
                "dynamic qparams of the initial weights");
  cmd->add_flag("--integer-forward", o.integer_forward,
                "llama: the forward GEMMs of a dynamic recipe (8da4w, 8da3w, 8da2w, w8a8_dynamic) "
                "run on the int8 codes, exact int32 sums with the scales applied per group "
                "(int8_matmul_ste): the deployed model's arithmetic; the backward stays the "
                "float GEMMs' through the STE");
  cmd->add_option("--learned-ranges-lr-factor", o.learned_range_lr_factor,
                  "llama --learned-ranges: the scales' learning rate is --lr times this factor "
                  "(1: torchao's one rate; Adam moves a parameter about the rate per step, and "
                  "the scales are far smaller than the weights)")
      ->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "adam, adamw or sgd")->capture_default_str();
  cmd->add_option("--batch", o.batch, "Batch size")->capture_default_str();
}

namespace {

// The GEMM recipe of the options (--recipe, or --weight-bits, --act-bits and --scope).
nn::QConfig gemm_qconfig_from(const TrainOptions& o) {
  QG_CHECK(!o.learned_ranges || o.model == "llama", "train",
           "--learned-ranges applies to --model llama's recipes, not --model ", o.model);
  if (!o.recipe.empty()) {
    nn::QConfig qc = nn::parse_recipe(o.recipe, o.group_size);
    qc.observer = nn::parse_observer(o.observer);
    qc.learned_weight_ranges = o.learned_ranges;
    qc.integer_forward = o.integer_forward;
    qc.validate();
    return qc;
  }
  nn::QConfig qc;
  qc.dynamic_weights = o.dynamic_weights;
  qc.weight_mapping = nn::parse_weight_mapping(o.weight_mapping);
  qc.weight = nn::parse_weight_quant(o.weight_bits);
  qc.activation = nn::parse_act_quant(o.act_bits);
  qc.observer = nn::parse_observer(o.observer);
  qc.weight_scope = o.scope;
  qc.weight_group_size = o.group_size;
  qc.learned_weight_ranges = o.learned_ranges;
  qc.integer_forward = o.integer_forward;
  return qc;
}

}  // namespace

nn::QConfig qconfig_from(const TrainOptions& o) {
  nn::QConfig qc = gemm_qconfig_from(o);
  qc.embedding_weight = nn::parse_embedding_quant(o.embedding_quant);
  qc.embedding_group_size = o.embedding_group_size;
  return qc;
}

std::string pct(double a) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * a);
  return b;
}

Row evaluate_row(const std::string& name, nn::Trainer& t, const nn::Dataset& test) {
  Row r;
  r.name = name;
  r.fake_quant_acc = t.evaluate(test);
  // The general conversion pass (nn/convert.h): integer codes + dequantize ops in the graph.
  double integer = t.integer_accuracy(test, &r.bytes);
  if (t.config().qconfig.quantized())
    r.integer_acc = integer;
  else
    r.float_integer_acc = integer;
  r.history = t.history();
  return r;
}

void run_training(nn::Trainer& t, int epochs, const std::string& label,
                  const std::string& checkpoint, int checkpoint_every, bool epoch_lines) {
  const bool tty = isatty(fileno(stdout)) != 0;
  while (t.epoch() < epochs) {
    auto start = std::chrono::steady_clock::now();
    auto last_draw = start;
    auto on_step = [&](const nn::StepInfo& s) {
      if (!tty) return;
      auto now = std::chrono::steady_clock::now();
      if (s.step_in_epoch != s.steps_per_epoch &&
          std::chrono::duration<double>(now - last_draw).count() < 0.05)
        return;
      last_draw = now;
      double secs = std::chrono::duration<double>(now - start).count();
      const int bar = 20;
      int filled =
          static_cast<int>(bar * s.step_in_epoch / std::max<int64_t>(s.steps_per_epoch, 1));
      std::string b(static_cast<size_t>(filled), '#');
      b.resize(bar, '.');
      std::printf(
          "\r%-8s epoch %3d/%d [%s] step %3lld/%lld  loss %.4f  acc %6.2f%%  %7.0f steps/s ",
          label.c_str(), s.epoch, epochs, b.c_str(), static_cast<long long>(s.step_in_epoch),
          static_cast<long long>(s.steps_per_epoch), s.loss, 100 * s.accuracy,
          secs > 0 ? s.step_in_epoch / secs : 0.0);
      std::fflush(stdout);
    };
    nn::EpochMetrics m = t.train_epoch(on_step);
    if (!epoch_lines) {
      if (tty) std::printf("\r%*s\r", 110, "");
    } else {
      int64_t steps =
          t.history().size() >= 2 ? m.step - t.history()[t.history().size() - 2].step : m.step;
      std::printf(
          "%s%-8s epoch %3d/%d  step %5lld  loss %.4f  train acc %6.2f%%  test acc %6.2f%%  %7.0f "
          "steps/s\n",
          tty ? "\r" : "", label.c_str(), m.epoch, epochs, static_cast<long long>(m.step),
          m.train_loss, 100 * m.train_accuracy, 100 * m.test_accuracy,
          m.seconds > 0 ? steps / m.seconds : 0.0);
    }
    std::fflush(stdout);
    if (!checkpoint.empty() && checkpoint_every > 0 && m.epoch % checkpoint_every == 0)
      t.save_checkpoint(checkpoint);
  }
}

void ensure_dir(const std::string& dir) {
  std::string path;
  std::istringstream parts(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') path = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    path += part + "/";
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      QG_FAIL("train", "cannot create directory '", path, "'");
  }
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

void write_metrics(const std::string& dir, const std::string& stem,
                   const std::vector<nn::EpochMetrics>& history, const std::string& extra_json) {
  std::ostringstream csv, json;
  csv.precision(9);
  json.precision(9);
  csv << "epoch,step,train_loss,train_accuracy,test_accuracy,seconds\n";
  json << "{\n  \"epochs\": [\n";
  for (size_t i = 0; i < history.size(); ++i) {
    const auto& m = history[i];
    csv << m.epoch << ',' << m.step << ',' << m.train_loss << ',' << m.train_accuracy << ','
        << m.test_accuracy << ',' << m.seconds << '\n';
    json << "    {\"epoch\": " << m.epoch << ", \"step\": " << m.step
         << ", \"train_loss\": " << m.train_loss << ", \"train_accuracy\": " << m.train_accuracy
         << ", \"test_accuracy\": " << m.test_accuracy << ", \"seconds\": " << m.seconds << "}"
         << (i + 1 < history.size() ? "," : "") << "\n";
  }
  json << "  ]" << (extra_json.empty() ? "" : ",\n" + extra_json) << "\n}\n";
  nn::write_file_atomic(dir + "/" + stem + ".csv", csv.str());
  nn::write_file_atomic(dir + "/" + stem + ".json", json.str());
}

bool starts_ranks(int nproc) {
  return nproc > 1 && std::getenv("WORLD_SIZE") == nullptr;
}

void run_launcher(int nproc, double dist_timeout, const std::string& command) {
  QG_CHECK(dist_timeout > 0, command, "--dist-timeout ", dist_timeout, " must be > 0");
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(f, a, '\0');) args.push_back(a);
  QG_CHECK(!args.empty(), command, "cannot read this process's command line");
  std::vector<std::string> argv;
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  argv.push_back(n > 0 ? std::string(exe, static_cast<size_t>(n)) : args[0]);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    argv.push_back(args[i]);
  }
  dist::LocalLaunch launch;
  launch.argv = argv;
  launch.nproc = nproc;
  launch.grace = std::chrono::milliseconds(static_cast<int64_t>(dist_timeout * 1000));
  std::printf("qat %s: starting %d ranks on this host\n", command.c_str(), nproc);
  std::fflush(stdout);
  dist::LaunchResult r = dist::launch_local(launch);
  QG_CHECK(r.failed_rank < 0, command, r.what, "; the other ranks were stopped");
}

std::unique_ptr<dist::ProcessGroup> join_group(double dist_timeout) {
  std::optional<dist::LaunchEnv> env = dist::LaunchEnv::from_environment();
  if (!env || env->world_size == 1) return nullptr;
  QG_CHECK(dist_timeout > 0, "launch", "--dist-timeout ", dist_timeout, " must be > 0");
  dist::GroupOptions go;
  go.timeout = dist::timeout_from_environment(
      std::chrono::milliseconds(static_cast<int64_t>(dist_timeout * 1000)));
  return dist::ProcessGroup::connect(*env, go);
}

void bind_rank(TrainOptions& o, dist::ProcessGroup& group) {
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda_available());
  o.local_rank = group.env().local_rank;
  o.comm = &group.communicator(cuda ? Device::cuda(o.local_rank) : Device::cpu());
  o.device = cuda ? "cuda" : "cpu";
  if (group.rank() > 0) {  // one output folder per rank; the checkpoint is rank 0's
    o.checkpoint_dir = o.out;
    o.out += "/rank" + std::to_string(group.rank());
  }
}

void run_reporting_failures(dist::ProcessGroup* group, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (group) group->report_failure(e.what());
    throw;
  }
}

}  // namespace qg::cli
