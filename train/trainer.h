// Training, evaluation, calibration and checkpointing of any model build_model makes (MLP,
// CNN, transformer; TrainConfig::model picks it) on a dataset. Every run goes through a
// compiled step (runtime/compile.h): the fusion passes, the memory plan and, on the GPU, one
// CUDA-graph replay per step. Shapes are fixed per graph, so the trainer compiles the model
// once per batch size it meets (the configured batch, and the last partial batch of a
// dataset) and all of them hold one set of states. The epoch's sample order comes from the
// trainer's seeded Rng, whose state is part of every checkpoint, so a resumed run replays
// the uninterrupted one bit for bit on the CPU.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/digits.h"
#include "device/communicator.h"
#include "nn/model.h"
#include "runtime/compile.h"
#include "runtime/distributed/gradient_sync.h"
#include "runtime/executor.h"
#include "train/evaluate.h"
#include "train/optimizer.h"

namespace qg::nn {

struct TrainConfig {
  std::string model = "mlp";  // mlp, cnn, transformer
  MlpSpec mlp;                // in_features, classes and batch for every kind; hidden for mlp
  CnnSpec cnn;
  TransformerSpec transformer;
  // Freeze the batch norms' running statistics after this many optimizer steps (PyTorch's
  // freeze_bn_stats); < 0: never.
  int64_t freeze_bn_after = -1;
  QConfig qconfig;
  OptimizerConfig optimizer;
  uint64_t seed = 1;
  Device device = Device::cpu();
  // Drop the last partial batch of each epoch (DataLoader's drop_last). False trains on it
  // too, through a step compiled at its size.
  bool drop_last = true;

  // Data parallelism (runtime/distributed/): the communicator this trainer is one rank of
  // (Gloo for a CPU device, NCCL for CUDA); null or a group of one: one process. Owned by the
  // caller. Each rank then trains on its shard of every global batch of
  // mlp.batch * world_size rows (the rows [rank * batch, (rank + 1) * batch) of it, in the
  // one seeded order all ranks share), the gradients are averaged over the ranks, and
  // observers and batch norms see the global batch, so N ranks train as one process on the
  // global batch would (docs/DISTRIBUTED.md gives the tolerances).
  Communicator* comm = nullptr;
  int64_t bucket_bytes = dist::kDefaultBucketBytes;  // gradient all-reduce buckets
  // The dtype gradients are all-reduced in (runtime/distributed/gradient_sync.h): f32, or bf16
  // / f16 for half the bytes on the wire.
  DType grad_reduce_dtype = DType::f32;
  bool sync_observers = true;   // false: each rank keeps its own (as DDP does)
  bool sync_batch_norm = true;  // SyncBatchNorm statistics
  // ZeRO stage 1 (runtime/distributed/optimizer_sharding.h): each rank holds and updates the
  // optimizer state of its share of the parameters, and the updated parameters are
  // all-gathered. Trains bit for bit as without it; checkpoints hold every rank's state.
  bool shard_optimizer_states = false;

  ModelSpec spec() const { return {model, mlp, cnn, transformer}; }
  int world_size() const;
  int rank() const;
};

struct EpochMetrics {
  int epoch = 0;
  int64_t step = 0;  // optimizer steps taken so far
  double train_loss = 0, train_accuracy = 0, test_accuracy = 0;
  double seconds = 0;  // wall time of the epoch (not part of determinism checks)
};

struct StepInfo {
  int epoch = 0;
  int64_t step_in_epoch = 0, steps_per_epoch = 0;
  double loss = 0, accuracy = 0;  // running means over the epoch so far
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, const Dataset& train, const Dataset& test);
  Trainer(const Trainer&) = delete;  // compiled steps hold its graphs and states
  Trainer& operator=(const Trainer&) = delete;

  // One pass over the training data in a fresh seeded order (the last partial batch is
  // dropped unless TrainConfig::drop_last is false); test accuracy is measured after it.
  EpochMetrics train_epoch(const std::function<void(const StepInfo&)>& on_step = {});
  // Accuracy in eval mode (observers frozen). Full batches run on the training graph; the
  // last partial batch runs on the model compiled at its size, holding the same states, so
  // every sample counts once and nothing is padded.
  double evaluate(const Dataset& data);
  // Logits for every row of `data` (eval mode), [n, classes] row-major.
  std::vector<float> predict(const Dataset& data);
  // Runs `batches` forward passes in training mode without optimizer steps, so observers
  // record the data's ranges (post-training quantization). Data parallel: `batches` batches
  // in all, each rank its share.
  void calibrate(const Dataset& data, int batches);
  // Copies every parameter value (buffers included) from `other` (same architecture).
  void copy_parameters_from(Trainer& other);

  // Mean wall time of one training step (forward, backward, optimizer) on a fixed batch,
  // after `warmup` untimed steps; the device is synchronised before the clock stops. The
  // steps are the compiled step `qat steps` times. Training state moves on: use a throwaway
  // trainer.
  double time_steps(int warmup, int steps);

  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);
  // Loads from checkpoint bytes already in memory; `what` names them in errors. A failed
  // load leaves the trainer unchanged.
  void load_checkpoint_bytes(const std::string& bytes, const std::string& what);

  // The model at the configured batch: its graph (compiled: passes applied), executor
  // (whose states every compiled batch size shares) and compiled step.
  Graph& graph() { return *main().graph; }
  Executor& executor() { return main().step->executor(); }
  CompiledStep& compiled() { return *main().step; }
  const Model& model() const { return programs_.at(config_.mlp.batch).model; }
  // How many batch sizes have been compiled so far.
  int compiled_batch_sizes() const { return static_cast<int>(programs_.size()); }
  // Accuracy of the model converted to integer weights (nn/convert.h); `bytes` receives
  // its size.
  double integer_accuracy(const Dataset& data, int64_t* bytes);
  // Sets every batch norm's `frozen` state (running statistics stop updating).
  void freeze_batch_norms();
  const TrainConfig& config() const { return config_; }
  const std::vector<EpochMetrics>& history() const { return history_; }
  int epoch() const { return epoch_; }
  int64_t step() const { return step_; }
  // Bytes of optimizer state (moments, step counts) this process holds: with
  // shard_optimizer_states, this rank's share only.
  int64_t optimizer_state_bytes();

 private:
  // The model compiled at one batch size.
  struct Program {
    std::unique_ptr<Graph> graph;
    Model model;
    std::unique_ptr<CompiledStep> step;
  };
  Program& main() { return programs_.at(config_.mlp.batch); }
  bool sharded() const { return config_.shard_optimizer_states && config_.world_size() > 1; }
  // Sharded runs: whether a state key belongs to the optimizer step of a parameter that
  // another rank owns (its state lives there).
  bool foreign_optimizer_state(const std::string& key) const;
  // Sharded runs: this rank's optimizer-state keys (those it holds and others lack).
  bool own_optimizer_state(const std::string& key) const;
  // The program at `rows` rows, compiled on first use with the main program's states.
  Program& program(int64_t rows);
  // Copies rows [start, start + rows) of `order` (all of `data` when order is empty) into
  // `x` and `labels`, sized for `rows`.
  void fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start,
                  int64_t rows, Tensor& x, Tensor& labels) const;
  // Forward pass of rows [start, start + rows) of `data` in eval mode; logits appended.
  void predict_rows(const Dataset& data, int64_t start, int64_t rows, std::vector<float>& out);
  // One training step on a filled batch; adds its loss and correct predictions.
  void train_rows(Program& p, const Tensor& x, const Tensor& labels, double& loss_sum,
                  int64_t& correct);
  // Fetched device tensor -> host bytes in `host` (no copy on the CPU).
  static const Tensor& on_host(const Tensor& t, Tensor& host);
  std::string config_key() const;

  TrainConfig config_;
  const Dataset& train_;
  const Dataset& test_;
  std::map<int64_t, Program> programs_;  // by batch size
  // Sharded runs: "<parameter>.<optimizer>/", the prefix of a parameter's optimizer-state
  // keys, and the rank that owns it.
  std::map<std::string, int> optimizer_state_owner_;
  Tensor host_loss_, host_logits_;  // reused for every fetch to the host
  Rng rng_;
  int epoch_ = 0;
  int64_t step_ = 0;
  std::vector<EpochMetrics> history_;
};

// The "key value" lines of a checkpoint's meta section (the file is fully checked first):
// "config", "seed", "epoch", "step", and, in checkpoints written since the export command
// exists, the model and recipe ("model", "hidden", "channels", "d_model", "heads", "blocks",
// "weight", "activation", "observer", "scope", "group_size", "optimizer", "batch", ...).
std::map<std::string, std::string> read_checkpoint_meta(const std::string& path);

}  // namespace qg::nn
