#include "nn/trainer.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"
#include "nn/checkpoint.h"
#include "runtime/passes/pass.h"

namespace qg::nn {
namespace {

// The data-order stream is derived from the seed but distinct from the init stream.
constexpr uint64_t kOrderStream = 0x9e3779b97f4a7c15ull;

int64_t argmax_row(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

std::string history_text(const std::vector<EpochMetrics>& h) {
  std::ostringstream os;
  os.precision(17);
  for (const auto& m : h)
    os << m.epoch << ' ' << m.step << ' ' << m.train_loss << ' ' << m.train_accuracy << ' '
       << m.test_accuracy << ' ' << m.seconds << '\n';
  return os.str();
}

// The meta section's "key value" lines.
std::map<std::string, std::string> parse_meta(const std::string& text, const std::string& path) {
  std::istringstream meta(text);
  std::map<std::string, std::string> kv;
  std::string line;
  while (std::getline(meta, line)) {
    size_t sp = line.find(' ');
    QG_CHECK(sp != std::string::npos, "checkpoint", path, ": malformed meta line '",
             printable(line), "'");
    kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return kv;
}

template <typename T>
std::string joined(const std::vector<T>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return v.empty() ? "none" : os.str();
}

// The model and recipe, one "key value" line each, so that a checkpoint names what it holds
// (`qat export` rebuilds the model from these). Readers ignore keys they do not know, so
// checkpoints without these lines (older ones) still load.
std::string describe(const TrainConfig& c) {
  std::ostringstream os;
  const QConfig& q = c.qconfig;
  os << "model " << c.model << "\nin_features " << c.mlp.in_features << "\nclasses "
     << c.mlp.classes << "\nhidden " << joined(c.mlp.hidden) << "\nchannels "
     << joined(c.cnn.channels) << "\nd_model " << c.transformer.d_model << "\nheads "
     << c.transformer.heads << "\nblocks " << c.transformer.layers << "\nmlp_hidden "
     << c.transformer.mlp_hidden << "\nweight " << weight_quant_name(q.weight) << "\nactivation "
     << act_quant_name(q.activation) << "\nobserver "
     << (q.observer == ObserverKind::minmax ? "minmax" : "moving_average") << "\nscope "
     << q.weight_scope << "\ngroup_size " << q.weight_group_size << "\noptimizer "
     << c.optimizer.kind << "\nbatch " << c.mlp.batch << "\nfreeze_bn_after " << c.freeze_bn_after
     << "\n";
  return os.str();
}

std::vector<EpochMetrics> parse_history(const std::string& text, const std::string& what) {
  std::vector<EpochMetrics> h;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    EpochMetrics m;
    ls >> m.epoch >> m.step >> m.train_loss >> m.train_accuracy >> m.test_accuracy >> m.seconds;
    QG_CHECK(!ls.fail(), "checkpoint", what, ": malformed history line '", printable(line), "'");
    h.push_back(m);
  }
  return h;
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, const Dataset& train, const Dataset& test)
    : config_(config), train_(train), test_(test), rng_(config.seed ^ kOrderStream) {
  QG_CHECK(train.features == config.mlp.in_features && test.features == config.mlp.in_features,
           "trainer", "dataset has ", train.features, " features, the model expects ",
           config.mlp.in_features);
  QG_CHECK(train.size() >= config.mlp.batch, "trainer", "training set of ", train.size(),
           " rows is smaller than one batch (", config.mlp.batch, ")");
  model_ = build_model(graph_, config.spec(), config.qconfig, config.seed);
  steps_ = add_optimizer(graph_, model_.loss, model_.parameters, config.optimizer);
  exec_ = std::make_unique<Executor>(graph_, config.device);
}

void Trainer::fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start,
                         Tensor& x, Tensor& labels) const {
  const int64_t b = config_.mlp.batch, f = data.features;
  float* px = x.data<float>();
  int64_t* py = labels.data<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    int64_t k = start + r;
    if (k < static_cast<int64_t>(order.size())) {
      int64_t i = order[k];
      std::memcpy(px + r * f, data.x.data() + i * f, sizeof(float) * f);
      py[r] = data.labels[i];
    } else {  // rows past the data (callers only ask for whole batches)
      std::memset(px + r * f, 0, sizeof(float) * f);
      py[r] = 0;
    }
  }
}

EpochMetrics Trainer::train_epoch(const std::function<void(const StepInfo&)>& on_step) {
  auto t0 = std::chrono::steady_clock::now();
  exec_->set_training(true);
  const int64_t b = config_.mlp.batch, classes = config_.mlp.classes;
  std::vector<int64_t> order = rng_.permutation(train_.size());
  const int64_t steps = train_.size() / b;
  Tensor x = Tensor::empty({b, train_.features}, DType::f32);
  Tensor labels = Tensor::empty({b}, DType::i64);
  double loss_sum = 0;
  int64_t correct = 0;
  StepInfo info;
  info.epoch = epoch_ + 1;
  info.steps_per_epoch = steps;
  for (int64_t s = 0; s < steps; ++s) {
    fill_batch(train_, order, s * b, x, labels);
    auto out = exec_->run({{"x", x}, {"labels", labels}}, {model_.loss, model_.logits}, steps_);
    Tensor loss = out[0].to(Device::cpu()), logits = out[1].to(Device::cpu());
    loss_sum += loss.at(0);
    const float* pl = logits.data<float>();
    for (int64_t r = 0; r < b; ++r)
      correct += argmax_row(pl + r * classes, classes) == labels.data<int64_t>()[r] ? 1 : 0;
    ++step_;
    if (config_.freeze_bn_after >= 0 && step_ == config_.freeze_bn_after) freeze_batch_norms();
    if (on_step) {
      info.step_in_epoch = s + 1;
      info.loss = loss_sum / static_cast<double>(s + 1);
      info.accuracy = static_cast<double>(correct) / static_cast<double>((s + 1) * b);
      on_step(info);
    }
  }
  EpochMetrics m;
  m.epoch = ++epoch_;
  m.step = step_;
  m.train_loss = loss_sum / static_cast<double>(steps);
  m.train_accuracy = static_cast<double>(correct) / static_cast<double>(steps * b);
  m.test_accuracy = evaluate(test_);
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back(m);
  return m;
}

double Trainer::time_steps(int warmup, int steps) {
  QG_CHECK(warmup >= 0 && steps > 0, "trainer", "time_steps(", warmup, ", ", steps, ")");
  exec_->set_training(true);
  const int64_t b = config_.mlp.batch;
  std::vector<int64_t> order(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) order[i] = i;
  Tensor x = Tensor::empty({b, train_.features}, DType::f32);
  Tensor labels = Tensor::empty({b}, DType::i64);
  fill_batch(train_, order, 0, x, labels);
  Executor::Feeds feeds{{"x", x.to(exec_->device())}, {"labels", labels.to(exec_->device())}};
  auto sync = [&] { exec_->run(feeds, {model_.loss})[0].to(Device::cpu()); };
  for (int i = 0; i < warmup; ++i) exec_->run(feeds, {}, steps_);
  sync();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) exec_->run(feeds, {}, steps_);
  // The final fetch waits for every queued kernel; it is one forward pass, not a step.
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

std::vector<float> Trainer::predict(const Dataset& data) {
  const int64_t b = config_.mlp.batch, classes = config_.mlp.classes;
  std::vector<float> out;
  out.reserve(static_cast<size_t>(data.size() * classes));
  const int64_t full = data.size() / b * b;
  for (int64_t start = 0; start < full; start += b) {
    std::vector<float> l = run_logits(*exec_, model_, data, start);
    out.insert(out.end(), l.begin(), l.end());
  }
  if (full < data.size()) {
    const int64_t rest = data.size() - full;
    if (!tail_.exec || tail_.model.batch != rest)
      tail_ = build_instance(config_.spec(), rest, config_.qconfig, exec_->device());
    copy_states(*exec_, *tail_.exec);
    std::vector<float> l = run_logits(*tail_.exec, tail_.model, data, full);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

double Trainer::integer_accuracy(const Dataset& data, int64_t* bytes) {
  return nn::integer_accuracy(*exec_, config_.spec(), config_.qconfig, data, bytes);
}

void Trainer::freeze_batch_norms() {
  for (const ConvBnLayer& c : model_.conv_bns) {
    // live_node: the fused node that holds the batch norm's state if a pass fused it.
    Tensor& f = exec_->state(live_node(graph_, c.bn_node), "frozen");
    std::vector<double> ones(static_cast<size_t>(f.numel()), 1.0);
    f = Tensor::from_doubles(f.shape(), ones, f.dtype()).to(exec_->device());
  }
}

double Trainer::evaluate(const Dataset& data) {
  return accuracy_of(predict(data), data, config_.mlp.classes);
}

void Trainer::calibrate(const Dataset& data, int batches) {
  exec_->set_training(true);
  const int64_t b = config_.mlp.batch;
  std::vector<int64_t> order(static_cast<size_t>(data.size()));
  for (int64_t i = 0; i < data.size(); ++i) order[i] = i;
  Tensor x = Tensor::empty({b, data.features}, DType::f32);
  Tensor labels = Tensor::empty({b}, DType::i64);
  for (int k = 0; k < batches && (k + 1) * b <= data.size(); ++k) {
    fill_batch(data, order, k * b, x, labels);
    exec_->run({{"x", x}}, {model_.logits});  // no optimizer targets: observers only
  }
}

void Trainer::copy_parameters_from(Trainer& other) {
  // Every graph parameter: the trainable ones and buffers such as batch-norm statistics.
  for (NodeId id : graph_.parameters()) {
    if (graph_.node(id).dead) continue;
    const std::string& name = graph_.value(graph_.node(id).outputs[0]).name;
    Tensor src = other.executor().parameter(name).to(exec_->device());
    Tensor& dst = exec_->parameter(name);
    QG_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "trainer", "parameter '",
             name, "' is ", dst.str(), " here but ", src.str(), " in the source model");
    dst = src;
  }
}

// What must match for a checkpoint to be loadable into this trainer.
std::string Trainer::config_key() const {
  std::ostringstream os;
  if (config_.model == "mlp") {
    os << "mlp=" << config_.mlp.in_features;
    for (int64_t h : config_.mlp.hidden) os << ',' << h;
    os << ',' << config_.mlp.classes;
  } else {
    os << config_.spec().str();
  }
  os << " freeze_bn_after=" << config_.freeze_bn_after << " batch=" << config_.mlp.batch
     << " qconfig=" << config_.qconfig.str() << " optimizer=" << config_.optimizer.kind;
  return os.str();
}

void Trainer::save_checkpoint(const std::string& path) {
  std::vector<CheckpointSection> sections;
  std::ostringstream meta;
  meta << "config " << config_key() << "\nseed " << config_.seed << "\nepoch " << epoch_
       << "\nstep " << step_ << "\n"
       << describe(config_);
  sections.push_back({"meta", meta.str()});
  sections.push_back({"rng", rng_.save()});
  sections.push_back({"history", history_text(history_)});
  // Every node state: parameters, optimizer moments and steps, observer statistics.
  std::map<std::string, int> seen;
  for (NodeId id = 0; id < graph_.num_nodes(); ++id) {
    const Node& n = graph_.node(id);
    if (n.dead || n.states.empty() || n.op->name == "constant") continue;  // immutable
    QG_CHECK(seen[n.name]++ == 0, "checkpoint", "two stateful nodes are both named '", n.name, "'");
    const std::vector<Tensor>& st = exec_->states(id);
    for (size_t i = 0; i < n.states.size(); ++i)
      sections.push_back({"state/" + n.name + "/" + n.states[i].name, encode_tensor(st[i])});
  }
  write_checkpoint(path, sections);
}

void Trainer::load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QG_CHECK(f.good(), "checkpoint", "cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  load_checkpoint_bytes(bytes, path);
}

void Trainer::load_checkpoint_bytes(const std::string& bytes, const std::string& path) {
  std::vector<CheckpointSection> sections = decode_checkpoint(bytes, path);
  std::map<std::string, const std::string*> by_name;
  for (const auto& s : sections) {
    QG_CHECK(by_name.emplace(s.name, &s.payload).second, "checkpoint", path,
             ": duplicate section '", printable(s.name), "'");
  }
  auto section = [&](const std::string& name) -> const std::string& {
    auto it = by_name.find(name);
    QG_CHECK(it != by_name.end(), "checkpoint", path, ": missing section '", name, "'");
    return *it->second;
  };
  // 1. metadata: the checkpoint must come from the same model and recipe.
  std::map<std::string, std::string> kv = parse_meta(section("meta"), path);
  QG_CHECK(kv["config"] == config_key(), "checkpoint", path, ": written for '",
           printable(kv["config"]), "', this trainer is '", config_key(), "'");
  int epoch = 0;
  int64_t step = 0;
  try {
    epoch = std::stoi(kv.at("epoch"));
    step = std::stoll(kv.at("step"));
  } catch (const std::exception&) {
    QG_FAIL("checkpoint", path, ": meta lacks a valid epoch/step");
  }
  // 2. decode everything before touching the trainer, so a bad file changes nothing.
  Rng rng;
  rng.load(section("rng"));
  std::vector<EpochMetrics> history = parse_history(section("history"), path);
  std::vector<std::pair<Tensor*, Tensor>> updates;
  size_t state_sections = 0;
  for (NodeId id = 0; id < graph_.num_nodes(); ++id) {
    const Node& n = graph_.node(id);
    if (n.dead || n.states.empty() || n.op->name == "constant") continue;  // immutable
    for (size_t i = 0; i < n.states.size(); ++i) {
      std::string key = "state/" + n.name + "/" + n.states[i].name;
      Tensor t = decode_tensor(section(key), path + " [" + key + "]");
      Tensor& dst = exec_->state(id, n.states[i].name);
      QG_CHECK(t.dtype() == dst.dtype() && t.shape() == dst.shape(), "checkpoint", path, ": '", key,
               "' holds ", dtype_name(t.dtype()), shape_str(t.shape()), ", the model needs ",
               dtype_name(dst.dtype()), shape_str(dst.shape()));
      updates.emplace_back(&dst, t.to(exec_->device()));
      ++state_sections;
    }
  }
  QG_CHECK(state_sections + 3 == sections.size(), "checkpoint", path, ": holds ", sections.size(),
           " sections, this model needs ", state_sections + 3);
  // 3. commit.
  for (auto& [dst, t] : updates) *dst = t;
  rng_ = rng;
  history_ = history;
  epoch_ = epoch;
  step_ = step;
}

std::map<std::string, std::string> read_checkpoint_meta(const std::string& path) {
  for (const auto& s : read_checkpoint(path))
    if (s.name == "meta") return parse_meta(s.payload, path);
  QG_FAIL("checkpoint", path, ": missing section 'meta'");
}

}  // namespace qg::nn
