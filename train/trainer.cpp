#include "train/trainer.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"
#include "device/communicator.h"
#include "runtime/distributed/gather_bytes.h"
#include "runtime/distributed/gradient_sync.h"
#include "runtime/distributed/optimizer_sharding.h"
#include "runtime/passes/pass.h"
#include "train/checkpoint.h"
#include "train/checkpoint_states.h"

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
     << q.weight_scope << "\ngroup_size " << q.weight_group_size << "\nweight_qparams "
     << (q.dynamic_weights ? "dynamic" : "observer") << "\nweight_mapping "
     << weight_mapping_name(q.weight_mapping) << "\noptimizer " << c.optimizer.kind << "\nbatch "
     << c.mlp.batch << "\nfreeze_bn_after " << c.freeze_bn_after << "\n";
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

int TrainConfig::world_size() const {
  return comm ? comm->world_size() : 1;
}
int TrainConfig::rank() const {
  return comm ? comm->rank() : 0;
}

Trainer::Trainer(const TrainConfig& config, const Dataset& train, const Dataset& test)
    : config_(config), train_(train), test_(test), rng_(config.seed ^ kOrderStream) {
  QG_CHECK(train.features == config.mlp.in_features && test.features == config.mlp.in_features,
           "trainer", "dataset has ", train.features, " features, the model expects ",
           config.mlp.in_features);
  QG_CHECK(train.size() >= config.mlp.batch * config.world_size(), "trainer", "training set of ",
           train.size(), " rows is smaller than one global batch (", config.mlp.batch, " x ",
           config.world_size(), " ranks)");
  QG_CHECK(config.world_size() == 1 || config.drop_last, "trainer",
           "data-parallel training drops each epoch's last partial global batch (drop_last)");
  QG_CHECK(!config.comm || config.comm->memory() == config.device.type, "trainer", "the ",
           config.comm ? config.comm->backend() : "", " communicator takes ",
           config.comm ? device_type_name(config.comm->memory()) : "", " buffers, the model is on ",
           config.device.str());
  program(config.mlp.batch);
}

Trainer::Program& Trainer::program(int64_t rows) {
  auto it = programs_.find(rows);
  if (it != programs_.end()) return it->second;
  Program p;
  p.graph = std::make_unique<Graph>();
  ModelSpec spec = config_.spec();
  spec.mlp.batch = rows;
  // Every batch size is built from the same seed, so each starts from the same weights; a
  // program added later takes the main program's states anyway.
  p.model = build_model(*p.graph, spec, config_.qconfig, config_.seed);
  TrainingSpec training{p.model.loss, p.model.parameters, optimizer_nodes(config_.optimizer), {}};
  CompileOptions options;
  options.device = config_.device;
  if (config_.world_size() > 1) {
    training.gradient_sync =
        dist::bucketed_all_reduce(config_.bucket_bytes, config_.grad_reduce_dtype);
    if (sharded()) {
      // Each rank's update nodes see only its own parameters' gradients, so a clip norm
      // would be that share's, not the global one.
      QG_CHECK(config_.optimizer.clip_grad_norm == 0.0, "trainer", "clip_grad_norm ",
               config_.optimizer.clip_grad_norm,
               " needs the global gradient norm; sharded optimizer states (ZeRO stage 1) see "
               "only each rank's share");
      training.optimizer =
          dist::shard_optimizer_states(training.optimizer, config_.rank(), config_.world_size());
      std::vector<int64_t> numels;
      for (ValueId v : p.model.parameters) numels.push_back(p.graph->value(v).type.numel());
      const dist::ShardPlan plan = dist::plan_optimizer_shards(numels, config_.world_size());
      for (size_t i = 0; i < p.model.parameters.size(); ++i)
        optimizer_state_owner_[p.graph->value(p.model.parameters[i]).name + "." +
                               config_.optimizer.kind + "/"] = plan.owner[i];
    }
    options.context.communicator = config_.comm;
    options.context.sync_statistics = config_.sync_observers;
    options.context.sync_batch_norm = config_.sync_batch_norm;
  }
  options.outputs = {p.model.loss, p.model.logits};
  p.step = std::make_unique<CompiledStep>(*p.graph, training, options);
  if (!programs_.empty()) share_states(main().step->executor(), p.step->executor());
  return programs_.emplace(rows, std::move(p)).first->second;
}

void Trainer::fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start,
                         int64_t rows, Tensor& x, Tensor& labels) const {
  const int64_t f = data.features;
  if (x.numel() != rows * f) x = Tensor::empty({rows, f}, DType::f32);
  if (labels.numel() != rows) labels = Tensor::empty({rows}, DType::i64);
  float* px = x.data<float>();
  int64_t* py = labels.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = start + r;
    const int64_t i = order.empty() ? k : order[k];
    std::memcpy(px + r * f, data.x.data() + i * f, sizeof(float) * f);
    py[r] = data.labels[i];
  }
}

const Tensor& Trainer::on_host(const Tensor& t, Tensor& host) {
  if (t.device().is_cpu()) return t;
  if (!host.defined() || host.dtype() != t.dtype() || host.shape() != t.shape())
    host = Tensor::empty(t.shape(), t.dtype());
  copy_bytes(host.raw_data(), host.device(), t.raw_data(), t.device(), t.nbytes());
  return host;
}

void Trainer::train_rows(Program& p, const Tensor& x, const Tensor& labels, double& loss_sum,
                         int64_t& correct) {
  const int64_t rows = x.shape()[0], classes = config_.mlp.classes;
  const std::vector<Tensor>& out =
      p.step->train({{"x", x}, {"labels", labels}}, {p.model.loss, p.model.logits});
  p.step->synchronize();
  // The batch's mean loss, weighed by its share of a full batch (exactly 1 for full ones).
  const double weight = rows == config_.mlp.batch
                            ? 1.0
                            : static_cast<double>(rows) / static_cast<double>(config_.mlp.batch);
  loss_sum += on_host(out[0], host_loss_).at(0) * weight;
  const float* pl = on_host(out[1], host_logits_).data<float>();
  for (int64_t r = 0; r < rows; ++r)
    correct += argmax_row(pl + r * classes, classes) == labels.data<int64_t>()[r] ? 1 : 0;
}

EpochMetrics Trainer::train_epoch(const std::function<void(const StepInfo&)>& on_step) {
  auto t0 = std::chrono::steady_clock::now();
  // Every rank draws the same order; rank r trains on rows [r * b, (r + 1) * b) of each
  // global batch of b * world rows.
  const int64_t b = config_.mlp.batch, n = train_.size();
  const int64_t world = config_.world_size(), shard = config_.rank() * b;
  std::vector<int64_t> order = rng_.permutation(n);
  const int64_t full = n / (b * world), rest = config_.drop_last ? 0 : n % b;
  const int64_t steps = full + (rest > 0 ? 1 : 0);
  Tensor x, labels;
  double loss_sum = 0;  // batch means, a partial batch weighed by its share of a full one
  int64_t correct = 0, seen = 0;
  StepInfo info;
  info.epoch = epoch_ + 1;
  info.steps_per_epoch = steps;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t rows = s < full ? b : rest;
    fill_batch(train_, order, s * b * world + shard, rows, x, labels);
    train_rows(program(rows), x, labels, loss_sum, correct);
    seen += rows;
    ++step_;
    if (config_.freeze_bn_after >= 0 && step_ == config_.freeze_bn_after) freeze_batch_norms();
    if (on_step) {
      info.step_in_epoch = s + 1;
      info.loss = loss_sum / (static_cast<double>(seen) / static_cast<double>(b));
      info.accuracy = static_cast<double>(correct) / static_cast<double>(seen);
      on_step(info);
    }
  }
  if (world > 1 && config_.comm->memory() == DeviceType::cpu) {
    // The epoch's metrics over the global batches (each rank's loss is its shard's mean).
    double sums[2] = {loss_sum, static_cast<double>(correct)};
    config_.comm->all_reduce(sums, 2, DType::f64, ReduceOp::sum);
    loss_sum = sums[0] / static_cast<double>(world);
    correct = static_cast<int64_t>(sums[1]);
    seen *= world;
  }
  EpochMetrics m;
  m.epoch = ++epoch_;
  m.step = step_;
  m.train_loss = loss_sum / (static_cast<double>(seen) / static_cast<double>(b * world));
  m.train_accuracy = static_cast<double>(correct) / static_cast<double>(seen);
  m.test_accuracy = evaluate(test_);
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back(m);
  return m;
}

double Trainer::time_steps(int warmup, int steps) {
  QG_CHECK(warmup >= 0 && steps > 0, "trainer", "time_steps(", warmup, ", ", steps, ")");
  Program& p = main();
  Tensor x, labels;
  fill_batch(train_, {}, 0, config_.mlp.batch, x, labels);
  // The batch is written once; later steps re-read the step's own input buffers, as the
  // steps `qat steps` times do.
  p.step->train({{"x", x}, {"labels", labels}}, {});
  for (int i = 0; i < warmup; ++i) p.step->train({}, {});
  p.step->synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) p.step->train({}, {});
  p.step->synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

void Trainer::predict_rows(const Dataset& data, int64_t start, int64_t rows,
                           std::vector<float>& out) {
  Program& p = program(rows);
  Tensor x, labels;
  fill_batch(data, {}, start, rows, x, labels);
  const std::vector<Tensor>& got = p.step->forward({{"x", x}}, {p.model.logits}, false);
  p.step->synchronize();
  const Tensor& logits = on_host(got[0], host_logits_);
  out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
}

std::vector<float> Trainer::predict(const Dataset& data) {
  const int64_t b = config_.mlp.batch;
  std::vector<float> out;
  out.reserve(static_cast<size_t>(data.size() * config_.mlp.classes));
  const int64_t full = data.size() / b * b;
  for (int64_t start = 0; start < full; start += b) predict_rows(data, start, b, out);
  if (full < data.size()) predict_rows(data, full, data.size() - full, out);
  return out;
}

double Trainer::integer_accuracy(const Dataset& data, int64_t* bytes) {
  return nn::integer_accuracy(executor(), config_.spec(), config_.qconfig, data, bytes);
}

void Trainer::freeze_batch_norms() {
  Program& p = main();
  for (const ConvBnLayer& c : p.model.conv_bns) {
    // live_node: the fused node that holds the batch norm's state if a pass fused it. The
    // flag is written in place: compiled steps hold its address.
    Tensor& f = executor().state(live_node(*p.graph, c.bn_node), "frozen");
    std::vector<double> ones(static_cast<size_t>(f.numel()), 1.0);
    Tensor host = Tensor::from_doubles(f.shape(), ones, f.dtype());
    copy_bytes(f.raw_data(), f.device(), host.raw_data(), host.device(), f.nbytes());
  }
}

double Trainer::evaluate(const Dataset& data) {
  return accuracy_of(predict(data), data, config_.mlp.classes);
}

void Trainer::calibrate(const Dataset& data, int batches) {
  const int64_t b = config_.mlp.batch;
  Program& p = main();
  Tensor x, labels;
  // Data parallel: rank r reads batch k * world + r, so the ranks observe distinct rows, and
  // every rank runs the same number of passes (their observers sync in each).
  const int64_t world = config_.world_size(), rank = config_.rank();
  for (int64_t k = 0; k < batches / world && (k + 1) * world * b <= data.size(); ++k) {
    fill_batch(data, {}, (k * world + rank) * b, b, x, labels);
    p.step->forward({{"x", x}}, {p.model.logits}, true);  // no optimizer: observers only
  }
  p.step->synchronize();
}

void Trainer::copy_parameters_from(Trainer& other) {
  // Every graph parameter: the trainable ones and buffers such as batch-norm statistics.
  const Graph& g = graph();
  for (NodeId id : g.parameters()) {
    if (g.node(id).dead) continue;
    const std::string& name = g.value(g.node(id).outputs[0]).name;
    const Tensor& src = other.executor().parameter(name);
    Tensor& dst = executor().parameter(name);
    QG_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "trainer", "parameter '",
             name, "' is ", dst.str(), " here but ", src.str(), " in the source model");
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
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
  // The global batch: a checkpoint resumes under another rank count that keeps it.
  os << " freeze_bn_after=" << config_.freeze_bn_after
     << " batch=" << config_.mlp.batch * config_.world_size()
     << " qconfig=" << config_.qconfig.str() << " optimizer=" << config_.optimizer.kind;
  return os.str();
}

bool Trainer::foreign_optimizer_state(const std::string& key) const {
  for (const auto& [prefix, owner] : optimizer_state_owner_)
    if (key.rfind(prefix, 0) == 0) return owner != config_.rank();
  return false;
}

bool Trainer::own_optimizer_state(const std::string& key) const {
  for (const auto& [prefix, owner] : optimizer_state_owner_)
    if (key.rfind(prefix, 0) == 0) return owner == config_.rank();
  return false;
}

int64_t Trainer::optimizer_state_bytes() {
  int64_t bytes = 0;
  const std::string suffix = "." + config_.optimizer.kind + "/";
  for (const auto& [key, t] : state_index(executor()))
    if (key.find(suffix) != std::string::npos) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
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
  // Every node state: parameters, optimizer moments and steps, observer statistics; keyed
  // by the nodes as built, so checkpoints do not depend on which fusion passes ran.
  std::map<std::string, std::string> states;
  std::vector<CheckpointSection> owned;
  for (const auto& [key, t] : state_index(executor())) {
    states["state/" + key] = encode_tensor(*t);
    if (sharded() && own_optimizer_state(key))
      owned.push_back({"state/" + key, states["state/" + key]});
  }
  // Sharded: the optimizer states live on their owners; every rank sends its own, so rank 0
  // writes the same file an unsharded run writes (and either kind of run resumes from it).
  if (sharded()) {
    main().step->synchronize();
    for (const std::string& blob :
         dist::all_gather_bytes(*config_.comm, encode_checkpoint(owned), config_.device))
      for (CheckpointSection& s : decode_checkpoint(blob, "a rank's optimizer states"))
        states[s.name] = std::move(s.payload);
  }
  for (auto& [name, payload] : states) sections.push_back({name, std::move(payload)});
  // Data parallel: every rank holds the same state, rank 0 writes it (atomically, as
  // write_checkpoint always does), and no rank goes on before the file is complete.
  if (config_.rank() == 0) write_checkpoint(path, sections);
  if (config_.world_size() > 1) config_.comm->barrier();
}

void Trainer::load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QG_CHECK(f.good(), "checkpoint", "cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  load_checkpoint_bytes(bytes, path);
}

void Trainer::load_checkpoint_bytes(const std::string& bytes, const std::string& path) {
  std::vector<CheckpointSection> sections = decode_checkpoint(bytes, path);
  const CheckpointSections section(sections, path);
  // 1. metadata: the checkpoint must come from the same model and recipe.
  std::map<std::string, std::string> kv = section.meta();
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
  std::vector<std::pair<Tensor*, Tensor>> updates = decode_states(executor(), section);
  // A sharded rank holds only its own optimizer states; the file has every rank's.
  size_t foreign = 0;
  if (sharded())
    for (const auto& s : sections)
      if (s.name.rfind("state/", 0) == 0 && foreign_optimizer_state(s.name.substr(6))) ++foreign;
  QG_CHECK(updates.size() + foreign + 3 == sections.size(), "checkpoint", path, ": holds ",
           sections.size(), " sections, this model needs ", updates.size() + foreign + 3);
  // 3. commit, in place: compiled steps hold the states' addresses.
  for (auto& [dst, t] : updates)
    copy_bytes(dst->raw_data(), dst->device(), t.raw_data(), t.device(), dst->nbytes());
  rng_ = rng;
  history_ = history;
  epoch_ = epoch;
  step_ = step;
}

std::map<std::string, std::string> read_checkpoint_meta(const std::string& path) {
  return CheckpointSections(read_checkpoint(path), path).meta();
}

}  // namespace qg::nn
