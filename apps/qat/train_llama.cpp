// `qat train --model llama`: a Llama-architecture decoder (nn/llama.h, sized by a Hugging
// Face config.json) trained on real text: the Python documentation's reStructuredText
// sources, tokenized by a SentencePiece BPE model (data/token_data.h), through
// nn::LmTrainer. Prints a progress bar, the validation loss and perplexity every
// --eval-every steps beside a unigram baseline, and writes metrics (CSV, JSON), curves (PNG)
// and a resumable checkpoint. --init starts from the parameters of another run's checkpoint
// (nn::LmTrainer::load_parameters); --compare is apps/qat/train_llama_compare.cpp.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "apps/qat/train_common.h"
#include "core/error.h"
#include "data/text_corpus.h"
#include "data/token_data.h"
#include "nn/llama_config.h"
#include "nn/llama_embedding.h"
#include "runtime/backend.h"
#include "runtime/memory_plan.h"
#include "train/checkpoint.h"
#include "train/lm_trainer.h"
#include "train/png_plot.h"

namespace qg::cli {
namespace {

void write_lm_metrics(const std::string& dir, const std::vector<nn::LmEvalRecord>& history,
                      const std::string& extra_json) {
  std::ostringstream csv, json;
  csv.precision(9);
  json.precision(9);
  csv << "step,train_loss,validation_loss,validation_perplexity,seconds\n";
  json << "{\n  \"evaluations\": [\n";
  for (size_t i = 0; i < history.size(); ++i) {
    const auto& r = history[i];
    csv << r.step << ',' << r.train_loss << ',' << r.validation_loss << ','
        << std::exp(r.validation_loss) << ',' << r.seconds << '\n';
    json << "    {\"step\": " << r.step << ", \"train_loss\": " << r.train_loss
         << ", \"validation_loss\": " << r.validation_loss
         << ", \"validation_perplexity\": " << std::exp(r.validation_loss)
         << ", \"seconds\": " << r.seconds << "}" << (i + 1 < history.size() ? "," : "") << "\n";
  }
  json << "  ],\n" << extra_json << "\n}\n";
  nn::write_file_atomic(dir + "/metrics.csv", csv.str());
  nn::write_file_atomic(dir + "/metrics.json", json.str());
}

Device lm_device(const std::string& device, int local_rank) {
  QG_CHECK(device == "auto" || device == "cpu" || device == "cuda", "train", "device '", device,
           "' is not one of auto, cpu, cuda");
  if (device == "cuda" || (device == "auto" && cuda_available())) return Device::cuda(local_rank);
  return Device::cpu();
}

void train_llama(const TrainOptions& o);

}  // namespace

nn::LmTrainConfig llama_train_config(const TrainOptions& o, const nn::LlamaConfig& model) {
  nn::LmTrainConfig c;
  c.model = model;
  c.qconfig = qconfig_from(o);
  c.batch = o.batch;
  c.seq = o.seq;
  c.lr.peak = o.lr;
  c.lr.warmup = o.warmup;
  c.lr.total = o.steps;
  c.lr.min_ratio = o.min_lr_ratio;
  c.optimizer.kind = o.optimizer;
  c.optimizer.weight_decay = o.weight_decay;
  c.optimizer.clip_grad_norm = o.clip_grad_norm;
  c.learned_range_lr_factor = o.learned_range_lr_factor;
  c.precision = nn::parse_precision(o.precision);
  c.recompute = o.recompute;
  c.seed = o.seed;
  c.device = lm_device(o.device, o.local_rank);
  c.validation_windows = o.eval_windows;
  c.comm = o.comm;
  c.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
  QG_CHECK(c.bucket_bytes > 0, "train", "--bucket-mb ", o.bucket_mb, " must be > 0");
  c.grad_reduce_dtype = dtype_from_name(o.grad_reduce_dtype);
  return c;
}

void run_llama_training(const TrainOptions& o) {
  QG_CHECK(o.time_steps == 0, "train",
           "--model llama times its step with `qat steps --model llama`: --time-steps is for "
           "the digits models");
  QG_CHECK(o.init.empty() || o.resume.empty(), "train", "--init '", o.init, "' and --resume '",
           o.resume, "' both set the starting weights; give one");
  if (o.compare) {
    QG_CHECK(o.nproc == 1, "train",
             "--model llama --compare trains several models one after the other in one "
             "process: --nproc is for a single run");
    run_llama_compare(o);
    return;
  }
  if (starts_ranks(o.nproc)) {
    run_launcher(o.nproc, o.dist_timeout, "train");
    return;
  }
  TrainOptions rank = o;
  std::unique_ptr<dist::ProcessGroup> group = join_group(o.dist_timeout);
  if (group) bind_rank(rank, *group);
  run_reporting_failures(group.get(), [&] { train_llama(rank); });
}

namespace {

// One rank's run (the whole run in one process): o.comm is its group's communicator.
void train_llama(const TrainOptions& o) {
  QG_CHECK(!o.llama_config.empty(), "train",
           "--model llama needs --config (a Hugging Face "
           "config.json)");
  QG_CHECK(!o.data.empty(), "train",
           "--model llama needs --data DIR (the folder that holds or receives the tokenizer "
           "model and the token cache)");
  QG_CHECK(o.steps > 0 && o.eval_every > 0, "train", "--steps ", o.steps, " and --eval-every ",
           o.eval_every, " must be > 0");
  nn::LlamaConfig model = nn::load_llama_config(o.llama_config);
  // The recipe and the embedding's quantizer are checked before the data is prepared (a
  // recipe the flags cannot make fails here, before the corpus is read).
  {
    const nn::QConfig qc = qconfig_from(o);
    qc.validate();
    nn::check_embedding_quant(qc, model);
  }
  const std::string corpus = o.corpus.empty() ? nn::default_text_corpus_dir() : o.corpus;
  // Data parallel: rank 0 trains the tokenizer and writes the token cache when they are
  // missing, and the other ranks read them once it is done.
  const int rank = o.comm ? o.comm->rank() : 0, world = o.comm ? o.comm->world_size() : 1;
  if (rank > 0) o.comm->barrier();
  nn::TokenData data =
      nn::prepare_token_data(corpus, o.data, model.vocab_size, [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      });
  if (rank == 0 && world > 1) o.comm->barrier();
  std::printf(
      "data: %s: %lld training tokens (%lld files), %lld validation tokens (%lld files); "
      "tokenizer %s, %lld pieces\n",
      corpus.c_str(), static_cast<long long>(data.train.size()),
      static_cast<long long>(data.train_files), static_cast<long long>(data.validation.size()),
      static_cast<long long>(data.validation_files), data.tokenizer_path.c_str(),
      static_cast<long long>(data.vocab_size));

  const nn::LmTrainConfig c = llama_train_config(o, model);
  nn::LmTrainer t(c, data.train, data.validation);
  ensure_dir(o.out);
  // The model's description beside its checkpoint, for `qat export`.
  nn::write_file_atomic(o.out + "/config.json", nn::read_text_file(o.llama_config));
  if (!o.init.empty())
    std::printf("initialised from the parameters of %s (trained as %s)\n", o.init.c_str(),
                t.load_parameters(o.init).c_str());
  if (!o.resume.empty()) {
    t.load_checkpoint(o.resume);
    std::printf("resumed from %s at step %lld\n", o.resume.c_str(),
                static_cast<long long>(t.step()));
  }
  const double unigram = t.unigram_validation_loss();
  std::printf(
      "qat train: llama hidden %lld, %lld layers, %lld heads (%lld kv), vocab %lld, %lld "
      "parameters; %s; %s; %s peak lr %g (weight decay %g, clip %g), warm-up %lld, cosine to "
      "%g x; batch %lld x %lld tokens, %lld steps, seed %llu, %s\n",
      static_cast<long long>(model.hidden_size), static_cast<long long>(model.num_hidden_layers),
      static_cast<long long>(model.num_attention_heads),
      static_cast<long long>(model.num_key_value_heads), static_cast<long long>(model.vocab_size),
      static_cast<long long>(t.parameter_count()), c.qconfig.str().c_str(),
      c.precision.str().c_str(), o.optimizer.c_str(), o.lr, o.weight_decay, o.clip_grad_norm,
      static_cast<long long>(o.warmup), o.min_lr_ratio, static_cast<long long>(o.batch),
      static_cast<long long>(o.seq), static_cast<long long>(o.steps),
      static_cast<unsigned long long>(o.seed), c.device.str().c_str());
  std::printf(
      "validation: %lld windows of %lld tokens; unigram baseline: loss %.4f, "
      "perplexity %.2f\n",
      static_cast<long long>(t.windows_per_evaluation()), static_cast<long long>(o.seq), unigram,
      std::exp(unigram));
  std::printf("step memory: %s planned for the activations and gradients (memory plan's arena)%s\n",
              format_bytes(t.planned_step_bytes()).c_str(),
              c.recompute ? ", recomputing each decoder block's activations in the backward" : "");
  if (world > 1)
    std::printf("data parallel: rank %d of %d (%s), global batch %lld x %lld tokens\n", rank, world,
                o.comm->backend().c_str(), static_cast<long long>(o.batch) * world,
                static_cast<long long>(o.seq));
  std::fflush(stdout);

  const std::string checkpoint =
      (o.checkpoint_dir.empty() ? o.out : o.checkpoint_dir) + "/checkpoint.qgck";
  const int64_t tokens_per_step = static_cast<int64_t>(o.batch) * world * o.seq;
  const bool tty = isatty(fileno(stdout)) != 0;
  double loss_sum = 0;
  int64_t losses = 0;
  auto since = std::chrono::steady_clock::now();
  auto last_draw = since;
  while (t.step() < o.steps) {
    loss_sum += t.train_step();
    ++losses;
    const int64_t s = t.step();
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - since).count();
    if (tty && std::chrono::duration<double>(now - last_draw).count() >= 0.05) {
      last_draw = now;
      const int bar = 20;
      const int filled = static_cast<int>(bar * s / o.steps);
      std::string b(static_cast<size_t>(filled), '#');
      b.resize(bar, '.');
      std::printf("\rllama [%s] step %6lld/%lld  loss %.4f  lr %.2e  %7.0f tokens/s ", b.c_str(),
                  static_cast<long long>(s), static_cast<long long>(o.steps), loss_sum / losses,
                  t.current_lr(), secs > 0 ? losses * tokens_per_step / secs : 0.0);
      if (o.clip_grad_norm > 0) std::printf(" grad norm %.3g ", t.last_grad_norm());
      std::fflush(stdout);
    }
    if (s % o.eval_every == 0 || s == o.steps) {
      const nn::LmEvalRecord& r = t.record(loss_sum / losses, secs);
      std::printf(
          "%sstep %6lld/%lld  train loss %.4f  validation loss %.4f  perplexity %.2f "
          "(unigram %.2f)  lr %.2e  %.0f tokens/s",
          tty ? "\r" : "", static_cast<long long>(s), static_cast<long long>(o.steps), r.train_loss,
          r.validation_loss, std::exp(r.validation_loss), std::exp(unigram), t.current_lr(),
          secs > 0 ? losses * tokens_per_step / secs : 0.0);
      if (o.clip_grad_norm > 0) std::printf("  grad norm %.3g", t.last_grad_norm());
      std::printf("\n");
      std::fflush(stdout);
      loss_sum = 0;
      losses = 0;
      since = std::chrono::steady_clock::now();
    }
    if (o.checkpoint_every > 0 && s % o.checkpoint_every == 0) t.save_checkpoint(checkpoint);
  }
  t.save_checkpoint(checkpoint);
  QG_CHECK(!t.history().empty(), "train", "no evaluation ran: --resume at step ", t.step(),
           " is already at --steps ", o.steps);
  const double final_loss = t.history().back().validation_loss;
  std::printf(
      "validation perplexity %.2f vs unigram %.2f (%.2fx lower); the step compiled %d "
      "time(s)\n",
      std::exp(final_loss), std::exp(unigram), std::exp(unigram - final_loss), t.compiles());
  std::ostringstream extra;
  extra.precision(9);
  extra << "  \"config\": \"" << json_escape(c.qconfig.str())
        << "\",\n  \"parameters\": " << t.parameter_count() << ",\n  \"unigram_loss\": " << unigram
        << ",\n  \"unigram_perplexity\": " << std::exp(unigram)
        << ",\n  \"validation_loss\": " << final_loss
        << ",\n  \"validation_perplexity\": " << std::exp(final_loss);
  write_lm_metrics(o.out, t.history(), extra.str());
  std::vector<double> train_loss, val_loss, base, val_ppl, base_ppl;
  for (const auto& r : t.history()) {
    train_loss.push_back(r.train_loss);
    val_loss.push_back(r.validation_loss);
    base.push_back(unigram);
    val_ppl.push_back(std::exp(r.validation_loss));
    base_ppl.push_back(std::exp(unigram));
  }
  const std::string x = "EVALUATION EVERY " + std::to_string(o.eval_every) + " STEPS";
  nn::write_plot_png(
      o.out + "/curves.png",
      {{"LOSS", {{"TRAIN", train_loss}, {"VALIDATION", val_loss}, {"UNIGRAM", base}}, x},
       {"PERPLEXITY", {{"VALIDATION", val_ppl}, {"UNIGRAM", base_ppl}}, x}});
  std::printf("wrote %s/metrics.json, metrics.csv, curves.png, checkpoint.qgck\n", o.out.c_str());
}

}  // namespace
}  // namespace qg::cli
