#include "train/lm_trainer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"
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
  const int64_t windows = validation_windows(static_cast<int64_t>(validation.size()), config.seq,
                                             config.validation_windows);
  eval_batches_ = windows / config.batch;
  QG_CHECK(eval_batches_ >= 1, "train.lm", "the validation stream of ", validation.size(),
           " tokens holds ", windows, " window(s) of ", config.seq,
           " tokens, less than one batch of ", config.batch);
  ids_ = Tensor::empty({config.batch, config.seq}, DType::i64);
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
  CompileOptions options;
  options.device = config_.device;
  p->step = std::make_unique<CompiledStep>(
      *p->graph, TrainingSpec{p->model.loss, p->model.parameters, optimizer_nodes(opt), {}},
      options);
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
  crops_.fill(ids_);
  labels_ = next_token_labels(ids_);
  const ValueId norm = grad_norm_value(*p.graph);
  std::vector<ValueId> fetches = {p.model.loss};
  if (norm != kNoValue) fetches.push_back(norm);
  const std::vector<Tensor>& out =
      p.step->train({{"input_ids", ids_}, {"labels", labels_}}, fetches);
  p.step->synchronize();
  ++step_;
  if (norm != kNoValue) last_grad_norm_ = on_host(out[1], host_norm_).at(0);
  return on_host(out[0], host_loss_).at(0);
}

double LmTrainer::evaluate() {
  Program& p = *program_;
  double sum = 0;
  Tensor ids = Tensor::empty({config_.batch, config_.seq}, DType::i64);
  for (int64_t b = 0; b < eval_batches_; ++b) {
    fill_windows(validation_, b * config_.batch, ids);
    const std::vector<Tensor>& out = p.step->forward(
        {{"input_ids", ids}, {"labels", next_token_labels(ids)}}, {p.model.loss}, false);
    p.step->synchronize();
    sum += on_host(out[0], host_loss_).at(0);
  }
  return sum / static_cast<double>(eval_batches_);
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
  for (int64_t w = 0; w < eval_batches_ * config_.batch; ++w)
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
     << " tied=" << m.tie_word_embeddings << " batch=" << config_.batch << " seq=" << config_.seq
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
  write_checkpoint(path, sections);
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

}  // namespace qg::nn
