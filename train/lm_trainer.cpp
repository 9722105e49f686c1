#include "train/lm_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"
#include "nn/learned_ranges.h"
#include "runtime/distributed/gather_bytes.h"
#include "runtime/distributed/gradient_sync.h"
#include "train/checkpoint.h"
#include "train/checkpoint_states.h"

namespace qg::nn {
namespace {

// The crop stream is derived from the seed but distinct from the init stream.
constexpr uint64_t kCropStream = 0x5851f42d4c957f2dull;

const Tensor& on_host(const Tensor& t, Tensor& host) {
  if (t.device().is_cpu()) return t;
  if (!host.defined() || host.dtype() != t.dtype() || host.shape() != t.shape())
    host = Tensor::empty(t.shape(), t.dtype());
  copy_bytes(host.raw_data(), host.device(), t.raw_data(), t.device(), t.nbytes());
  return host;
}

std::string history_text(const std::vector<LmEvalRecord>& h) {
  std::ostringstream os;
  os.precision(17);
  for (const auto& r : h)
    os << r.step << ' ' << r.train_loss << ' ' << r.validation_loss << ' ' << r.seconds << '\n';
  return os.str();
}

std::vector<LmEvalRecord> parse_history(const std::string& text, const std::string& what) {
  std::vector<LmEvalRecord> h;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    LmEvalRecord r;
    ls >> r.step >> r.train_loss >> r.validation_loss >> r.seconds;
    QG_CHECK(!ls.fail(), "checkpoint", what, ": malformed history line '", printable(line), "'");
    h.push_back(r);
  }
  return h;
}

// The architecture part of a config key (what a parameter must match to be loadable) and the
// recipe part: the batch, the window and the optimizer do not change any parameter's shape.
std::string key_part(const std::string& key, const std::string& from, const std::string& to) {
  const size_t begin = from.empty() ? 0 : key.find(from);
  if (begin == std::string::npos) return "";
  const size_t start = begin + from.size();
  const size_t end = key.find(to, start);
  return key.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

struct LmTrainer::Program {
  std::unique_ptr<Graph> graph;
  LlamaModel model;
  std::unique_ptr<CompiledStep> step;
  double lr = 0;
};

LmTrainer::LmTrainer(const LmTrainConfig& config, const std::vector<int32_t>& train,
                     const std::vector<int32_t>& validation)
    : config_(config),
      train_(train),
      validation_(validation),
      crops_(train, config.seq, config.seed ^ kCropStream) {
  const LlamaConfig& m = config.model;
  config.lr.validate();
  // adam reads its rate at run time too (the same update as its attribute form, bit for bit).
  config_.optimizer.runtime_lr = config.optimizer.kind != "sgd";
  config_.optimizer.validate();
  config.precision.validate();
  QG_CHECK(config.batch >= 1 && config.seq >= 2, "train.lm", "batch ", config.batch, " and seq ",
           config.seq, ": need batch >= 1 and seq >= 2");
  QG_CHECK(config.seq <= m.max_position_embeddings, "train.lm", "seq ", config.seq,
           " exceeds the config's max_position_embeddings ", m.max_position_embeddings);
  for (const auto* side : {&train, &validation}) {
    const int32_t top = max_token_id(*side);
    QG_CHECK(top < m.vocab_size, "train.lm", "token id ", top, " of the ",
             side == &train ? "training" : "validation", " stream is >= the config's vocab_size ",
             m.vocab_size, " (the tokenizer has more pieces than the model has embeddings)");
  }
  QG_CHECK(!config.comm || config.comm->memory() == config.device.type, "train.lm", "the ",
           config.comm ? config.comm->backend() : "", " communicator takes ",
           config.comm ? device_type_name(config.comm->memory()) : "", " buffers, the model is on ",
           config.device.str());
  const int world = config.world_size();
  const int64_t windows = validation_windows(static_cast<int64_t>(validation.size()), config.seq,
                                             config.validation_windows);
  eval_batches_ = windows / global_batch();
  QG_CHECK(eval_batches_ >= 1, "train.lm", "the validation stream of ", validation.size(),
           " tokens holds ", windows, " window(s) of ", config.seq,
           " tokens, less than one batch of ", global_batch(),
           world > 1 ? " (" + std::to_string(config.batch) + " per rank x " +
                           std::to_string(world) + " ranks)"
                     : "");
  ids_ = Tensor::empty({config.batch, config.seq}, DType::i64);
  if (world > 1) global_ids_ = Tensor::empty({global_batch(), config.seq}, DType::i64);
  program_for(current_lr());
}

LmTrainer::~LmTrainer() = default;

Executor& LmTrainer::executor() {
  return program_->step->executor();
}

double LmTrainer::current_lr() const {
  return config_.optimizer.has_runtime_lr() ? config_.lr.at(step_) : config_.lr.applied(step_);
}

LmTrainer::Program& LmTrainer::program_for(double lr) {
  if (program_ && (program_->lr == lr || config_.optimizer.has_runtime_lr())) return *program_;
  auto p = std::make_unique<Program>();
  p->graph = std::make_unique<Graph>();
  p->model = build_llama(*p->graph, config_.model, config_.batch, config_.seq, config_.qconfig,
                         config_.seed, config_.precision);
  OptimizerConfig opt = config_.optimizer;
  opt.lr = lr;
  if (config_.learned_range_lr_factor != 1.0)
    for (ValueId s : learned_scales(p->model.weights))
      opt.lr_factors[p->graph->value(s).name] = config_.learned_range_lr_factor;
  CompileOptions options;
  options.device = config_.device;
  TrainingSpec training{p->model.loss, p->model.parameters, optimizer_nodes(opt), {}};
  if (config_.recompute) training.recompute = p->model.blocks;
  if (config_.world_size() > 1) {
    training.gradient_sync =
        dist::bucketed_all_reduce(config_.bucket_bytes, config_.grad_reduce_dtype);
    options.context.communicator = config_.comm;
  }
  p->step = std::make_unique<CompiledStep>(*p->graph, training, options);
  // Node names do not depend on the rate, so every state (weights, moments, observers)
  // carries over as the very same tensor.
  if (program_) share_states(program_->step->executor(), p->step->executor());
  p->lr = lr;
  program_ = std::move(p);
  ++compiles_;
  return *program_;
}

double LmTrainer::train_step() {
  const double lr = current_lr();
  Program& p = program_for(lr);
  if (config_.optimizer.has_runtime_lr()) set_learning_rate(p.step->executor(), lr);
  if (config_.world_size() == 1) {
    crops_.fill(ids_);
  } else {
    // Every rank draws the whole global batch, so the crop stream stays that of one process
    // on the global batch (and checkpoints resume under any rank count); this rank's shard
    // is rows [rank * batch, (rank + 1) * batch).
    crops_.fill(global_ids_);
    const size_t shard = static_cast<size_t>(ids_.numel());
    std::memcpy(ids_.data<int64_t>(), global_ids_.data<int64_t>() + config_.rank() * shard,
                shard * sizeof(int64_t));
  }
  labels_ = next_token_labels(ids_);
  const std::vector<ValueId> fetches = train_fetches(p);
  const ValueId norm = fetches.size() > 1 ? fetches[1] : kNoValue;
  const std::vector<Tensor>& out =
      p.step->train({{"input_ids", ids_}, {"labels", labels_}}, fetches);
  p.step->synchronize();
  ++step_;
  if (norm != kNoValue) last_grad_norm_ = on_host(out[1], host_norm_).at(0);
  return mean_over_ranks(on_host(out[0], host_loss_).at(0));
}

std::vector<ValueId> LmTrainer::train_fetches(Program& p) const {
  std::vector<ValueId> fetches = {p.model.loss};
  const ValueId norm = grad_norm_value(*p.graph);
  if (norm != kNoValue) fetches.push_back(norm);
  return fetches;
}

int64_t LmTrainer::planned_step_bytes() {
  Program& p = *program_;
  return p.step->planned_arena_bytes(train_fetches(p), /*update=*/true, /*training=*/true);
}

const RecomputeStats& LmTrainer::recompute_stats() const {
  return program_->step->recompute_stats();
}

double LmTrainer::mean_over_ranks(double value) const {
  const int world = config_.world_size();
  if (world == 1) return value;
  dist::all_reduce_host(*config_.comm, &value, 1, ReduceOp::sum, config_.device);
  return value / static_cast<double>(world);
}

double LmTrainer::evaluate() {
  Program& p = *program_;
  double sum = 0;
  Tensor ids = Tensor::empty({config_.batch, config_.seq}, DType::i64);
  // Data parallel: this rank's shard of each global batch of windows; the batch means are
  // then averaged over every rank's batches (the shards are equal in size).
  for (int64_t b = 0; b < eval_batches_; ++b) {
    fill_windows(validation_, b * global_batch() + config_.rank() * config_.batch, ids);
    const std::vector<Tensor>& out = p.step->forward(
        {{"input_ids", ids}, {"labels", next_token_labels(ids)}}, {p.model.loss}, false);
    p.step->synchronize();
    sum += on_host(out[0], host_loss_).at(0);
  }
  return mean_over_ranks(sum) / static_cast<double>(eval_batches_);
}

const LmEvalRecord& LmTrainer::record(double train_loss, double seconds) {
  history_.push_back({step_, train_loss, evaluate(), seconds});
  return history_.back();
}

double LmTrainer::unigram_validation_loss() const {
  const int64_t vocab = config_.model.vocab_size;
  std::vector<double> count(static_cast<size_t>(vocab), 1.0);  // add-one smoothing
  for (int32_t t : train_) count[static_cast<size_t>(t)] += 1.0;
  const double total = static_cast<double>(train_.size()) + static_cast<double>(vocab);
  // The targets evaluate() scores: tokens 1 .. seq - 1 of each window.
  double nll = 0;
  int64_t n = 0;
  for (int64_t w = 0; w < windows_per_evaluation(); ++w)
    for (int64_t i = 1; i < config_.seq; ++i, ++n)
      nll -= std::log(count[static_cast<size_t>(validation_[w * config_.seq + i])] / total);
  return nll / static_cast<double>(n);
}

int64_t LmTrainer::parameter_count() const {
  int64_t n = 0;
  for (ValueId v : program_->model.parameters) n += program_->graph->value(v).type.numel();
  return n;
}

std::string LmTrainer::config_key() const {
  const LlamaConfig& m = config_.model;
  std::ostringstream os;
  os << "llama hidden=" << m.hidden_size << " intermediate=" << m.intermediate_size
     << " layers=" << m.num_hidden_layers << " heads=" << m.num_attention_heads
     << " kv_heads=" << m.num_key_value_heads << " vocab=" << m.vocab_size
     << " tied=" << m.tie_word_embeddings << " batch=" << global_batch() << " seq=" << config_.seq
     << " qconfig=" << config_.qconfig.str() << " optimizer=" << config_.optimizer.kind;
  // Only a non-default policy is named, so f32 checkpoints keep their key.
  if (!(config_.precision == PrecisionPolicy::f32()))
    os << " precision=" << config_.precision.name();
  return os.str();
}

void LmTrainer::save_checkpoint(const std::string& path) {
  std::vector<CheckpointSection> sections;
  std::ostringstream meta;
  meta << "config " << config_key() << "\nseed " << config_.seed << "\nstep " << step_ << "\n";
  sections.push_back({"meta", meta.str()});
  sections.push_back({"crops", crops_.save_state()});
  sections.push_back({"history", history_text(history_)});
  program_->step->synchronize();
  for (const auto& [key, t] : state_index(executor()))
    sections.push_back({"state/" + key, encode_tensor(*t)});
  // Data parallel: every rank holds the same state; rank 0 writes it (atomically, as
  // write_checkpoint always does), and no rank goes on before the file is complete.
  if (config_.rank() == 0) write_checkpoint(path, sections);
  if (config_.world_size() > 1) config_.comm->barrier();
}

void LmTrainer::load_checkpoint(const std::string& path) {
  std::vector<CheckpointSection> sections = read_checkpoint(path);
  // train_step writes the schedule's rate before every step, so a checkpoint without the
  // rate's state (one written by a trainer whose rate was an attribute) loads with a
  // placeholder for it.
  const std::string lr_section = std::string("state/") + kLearningRateName + "/value";
  if (config_.optimizer.has_runtime_lr() &&
      std::none_of(sections.begin(), sections.end(),
                   [&](const CheckpointSection& s) { return s.name == lr_section; }))
    sections.push_back({lr_section, encode_tensor(Tensor::from_doubles({}, {0.0}, DType::f64))});
  const CheckpointSections section(sections, path);
  std::map<std::string, std::string> kv = section.meta();
  QG_CHECK(kv["config"] == config_key(), "checkpoint", path, ": written for '",
           printable(kv["config"]), "', this trainer is '", config_key(), "'");
  int64_t step = 0;
  try {
    step = std::stoll(kv.at("step"));
  } catch (const std::exception&) {
    QG_FAIL("checkpoint", path, ": meta lacks a valid step");
  }
  // Everything is decoded and checked before the trainer changes.
  Rng probe;
  probe.load(section("crops"));
  std::vector<LmEvalRecord> history = parse_history(section("history"), path);
  std::vector<std::pair<Tensor*, Tensor>> updates = decode_states(executor(), section);
  QG_CHECK(updates.size() + 3 == sections.size(), "checkpoint", path, ": holds ", sections.size(),
           " sections, this model needs ", updates.size() + 3);
  for (auto& [dst, t] : updates)
    copy_bytes(dst->raw_data(), dst->device(), t.raw_data(), t.device(), dst->nbytes());
  crops_.load_state(section("crops"));
  history_ = history;
  step_ = step;
}

void LmTrainer::copy_parameters_from(LmTrainer& other) {
  const std::string mine = key_part(config_key(), "", " batch=");
  const std::string theirs = key_part(other.config_key(), "", " batch=");
  QG_CHECK(mine == theirs, "train.lm", "cannot copy the parameters of '", theirs, "' into '", mine,
           "'");
  other.program_->step->synchronize();
  const std::vector<ValueId> scales = learned_scales(program_->model.weights);
  for (ValueId v : program_->model.parameters) {
    if (std::find(scales.begin(), scales.end(), v) != scales.end()) continue;
    const std::string& name = program_->graph->value(v).name;
    const Tensor& src = other.executor().parameter(name);
    Tensor& dst = executor().parameter(name);
    QG_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "train.lm", "parameter '",
             name, "' is ", dst.str(), " here but ", src.str(), " in the source model");
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
  }
  initialize_learned_ranges(executor(), program_->model.weights, config_.qconfig);
}

std::string LmTrainer::load_parameters(const std::string& path) {
  std::vector<CheckpointSection> sections = read_checkpoint(path);
  const CheckpointSections section(sections, path);
  std::map<std::string, std::string> kv = section.meta();
  const std::string mine = key_part(config_key(), "", " batch=");
  const std::string theirs = key_part(kv["config"], "", " batch=");
  QG_CHECK(mine == theirs, "checkpoint", path, ": written for the model '", printable(theirs),
           "', this trainer's is '", mine, "'");
  // Everything is decoded and checked before the trainer changes.
  std::vector<std::pair<Tensor*, Tensor>> updates;
  const std::vector<ValueId> scales = learned_scales(program_->model.weights);
  for (ValueId v : program_->model.parameters) {
    if (std::find(scales.begin(), scales.end(), v) != scales.end()) continue;
    const std::string& name = program_->graph->value(v).name;
    const std::string key = "state/" + name + "/value";
    Tensor t = decode_tensor(section(key), path + " [" + key + "]");
    Tensor& dst = executor().parameter(name);
    QG_CHECK(t.dtype() == dst.dtype() && t.shape() == dst.shape(), "checkpoint", path, ": '", key,
             "' holds ", t.str(), ", the model needs ", dst.str());
    updates.emplace_back(&dst, std::move(t));
  }
  program_->step->synchronize();
  for (auto& [dst, t] : updates)
    copy_bytes(dst->raw_data(), dst->device(), t.raw_data(), t.device(), dst->nbytes());
  initialize_learned_ranges(executor(), program_->model.weights, config_.qconfig);
  return key_part(kv["config"], " qconfig=", " optimizer=");
}

void LmTrainer::continue_crops_from(const LmTrainer& other) {
  QG_CHECK(other.config_.seq == config_.seq, "train.lm", "crops of ", other.config_.seq,
           " tokens cannot continue as crops of ", config_.seq);
  crops_.load_state(other.crops_.save_state());
}

}  // namespace qg::nn
