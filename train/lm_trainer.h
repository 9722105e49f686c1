// Training of a Llama-architecture language model (nn/llama.h) on token streams
// (data/token_loader.h): steps rather than epochs. Each optimizer step feeds `batch` random
// crops of `seq` tokens from the training stream; the model predicts each crop's next
// tokens (seq - 1 targets per crop). Validation is the mean loss over fixed
// non-overlapping windows of the validation stream, in whole batches. Every step goes
// through a compiled step (runtime/compile.h), as nn::Trainer's do; the learning rate
// follows an LrSchedule. adam and adamw read it from a runtime variable written before
// every step, so the step compiles once and applies the schedule's exact value; sgd takes
// it as an attribute and recompiles at the schedule's levels (train/lr_schedule.h). The
// crop sampler's RNG state, the step and the evaluation history are part of every
// checkpoint, so a resumed run continues the uninterrupted one bit for bit on the CPU.
//
// Data parallel (LmTrainConfig::comm): N ranks train as one process on the global batch of
// batch x N crops would, up to the order of the gradient additions (docs/DISTRIBUTED.md).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_loader.h"
#include "device/communicator.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/distributed/gradient_sync.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace qg::nn {

struct LmTrainConfig {
  LlamaConfig model;
  QConfig qconfig;
  int64_t batch = 8, seq = 64;
  LrSchedule lr;
  // kind, betas, weight_decay, clip_grad_norm; the rate comes from `lr`.
  OptimizerConfig optimizer;
  // The model's float dtypes (nn/qconfig.h): bf16_mixed() keeps f32 parameters and
  // optimizer states and runs the GEMMs and attention in bf16.
  PrecisionPolicy precision;
  uint64_t seed = 1;
  Device device = Device::cpu();
  int64_t validation_windows = 0;  // cap on the windows evaluated (<= 0: all)
  // Learned weight ranges (QConfig::learned_weight_ranges): the scales' rate is the rate
  // times this factor (1: the same rate, as torchao's scales under one optimizer).
  double learned_range_lr_factor = 1.0;
  // Activation recomputation per decoder block (autograd/recompute.h): the backward reruns
  // each block's forward instead of keeping its activations. Same values bit for bit, and a
  // lower planned peak wherever activations set it (not where the weight gradients, alive at
  // the end of the backward either way, do); checkpoints do not depend on it.
  bool recompute = false;

  // Data parallelism (runtime/distributed/): the communicator this trainer is one rank of
  // (Gloo for a CPU device, NCCL for CUDA; owned by the caller); null or a group of one: one
  // process. `batch` is then per rank: every rank draws the same global batch of
  // batch * world_size crops from the one crop stream, in the order one process with that
  // batch draws them, and trains on crops [rank * batch, (rank + 1) * batch); the gradients
  // are averaged over the ranks in buckets of `bucket_bytes`. The losses train_step() and
  // evaluate() return are the global batch's, the same number on every rank. Rank 0 writes
  // checkpoints, keyed on the global batch, so a run resumes under any rank count that keeps
  // it.
  Communicator* comm = nullptr;
  int64_t bucket_bytes = dist::kDefaultBucketBytes;
  // The dtype the gradient buckets travel and are summed in (gradient_sync.h): f32, or bf16
  // (f16) for half the bytes, as FSDP's reduce_dtype.
  DType grad_reduce_dtype = DType::f32;

  int world_size() const { return comm ? comm->world_size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

struct LmEvalRecord {
  int64_t step = 0;
  double train_loss = 0;  // mean over the steps since the previous record
  double validation_loss = 0;
  double seconds = 0;  // training wall time since the previous record
};

class LmTrainer {
 public:
  // Throws qg::Error (op "train.lm") when a token id is >= the config's vocab_size, seq
  // exceeds max_position_embeddings, the validation stream holds less than one global batch
  // of windows, or the communicator's memory is not the device's; the model and optimizer
  // report their own errors.
  LmTrainer(const LmTrainConfig& config, const std::vector<int32_t>& train,
            const std::vector<int32_t>& validation);
  ~LmTrainer();
  LmTrainer(const LmTrainer&) = delete;
  LmTrainer& operator=(const LmTrainer&) = delete;

  // One optimizer step on fresh crops; returns its loss (data parallel: the mean of the
  // ranks' shard losses).
  double train_step();
  // Mean cross-entropy (nats per token) over the validation windows, eval mode. Data
  // parallel: each rank evaluates its shard of every global batch of windows, and the mean
  // is taken over all of them.
  double evaluate();
  // Adds an evaluation record (evaluate() now, the mean of the losses since the last one).
  const LmEvalRecord& record(double train_loss, double seconds);

  // The cross-entropy of the validation windows' targets under the training stream's token
  // frequencies (add-one smoothed over the vocabulary): the perplexity a model that ignores
  // context reaches.
  double unigram_validation_loss() const;

  // Data parallel: every rank calls it; rank 0 writes the file (atomically), and no rank
  // returns before it is complete.
  void save_checkpoint(const std::string& path);
  // A failed load leaves the trainer unchanged.
  void load_checkpoint(const std::string& path);

  // Starting points for fine-tuning (`qat train --model llama --compare`): the trainable
  // parameters (by name) of another trainer or of a checkpoint, into this trainer's model
  // whatever its recipe; the optimizer moments, the step and the history stay as they are.
  // A model of another architecture (sizes, heads, vocabulary) is a named error. Learned
  // weight ranges are not copied: they restart from the copied weights' dynamic qparams
  // (nn/learned_ranges.h).
  void copy_parameters_from(LmTrainer& other);
  // Returns the QConfig description (QConfig::str()) the checkpoint was trained with. A
  // failed load leaves the trainer unchanged.
  std::string load_parameters(const std::string& path);
  // The crop sampler continues from where `other`'s stands (a fine-tune sees the crops that
  // pre-training would have drawn next).
  void continue_crops_from(const LmTrainer& other);

  int64_t step() const { return step_; }
  // The rate the next step applies: the schedule's value (its level under sgd).
  double current_lr() const;
  // The total gradient norm before clipping of the last step (clip_grad_norm > 0; NaN
  // before the first step or without clipping).
  double last_grad_norm() const { return last_grad_norm_; }
  int64_t windows_per_evaluation() const { return eval_batches_ * global_batch(); }
  int compiles() const { return compiles_; }
  // The memory plan's peak of one training step's values (runtime/memory_plan.h).
  int64_t planned_step_bytes();
  // What activation recomputation copied (zeros without LmTrainConfig::recompute).
  const RecomputeStats& recompute_stats() const;
  int64_t parameter_count() const;
  const std::vector<LmEvalRecord>& history() const { return history_; }
  const LmTrainConfig& config() const { return config_; }
  Executor& executor();

 private:
  struct Program;
  // The program whose rate is `lr`, built with the current program's states; with a runtime
  // rate the one program, whatever `lr`.
  Program& program_for(double lr);
  std::string config_key() const;
  // What a training step fetches: the loss, and the gradient norm when clipping.
  std::vector<ValueId> train_fetches(Program& p) const;
  int64_t global_batch() const { return config_.batch * config_.world_size(); }
  // The mean of `value` over the ranks (the value itself in one process).
  double mean_over_ranks(double value) const;

  LmTrainConfig config_;
  const std::vector<int32_t>& train_;
  const std::vector<int32_t>& validation_;
  std::unique_ptr<Program> program_;
  TokenCrops crops_;
  int64_t eval_batches_ = 0;
  int64_t step_ = 0;
  int compiles_ = 0;
  Tensor ids_, labels_, host_loss_, host_norm_;
  Tensor global_ids_;  // data parallel: the global batch's crops, of which ids_ is a shard
  double last_grad_norm_ = std::nan("");
  std::vector<LmEvalRecord> history_;
};

}  // namespace qg::nn
