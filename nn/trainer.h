// Training, evaluation, calibration and checkpointing of any model build_model makes (MLP,
// CNN, transformer; TrainConfig::model picks it) on a dataset. One
// Executor::run per step runs forward, backward and the optimizer nodes. The epoch's sample
// order comes from the trainer's seeded Rng, whose state is part of every checkpoint, so a
// resumed run replays the uninterrupted one bit for bit on the CPU.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/convert.h"
#include "nn/digits.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/executor.h"

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

  ModelSpec spec() const { return {model, mlp, cnn, transformer}; }
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

  // One pass over the training data in a fresh seeded order (the last partial batch is
  // dropped, as DataLoader(drop_last=True)); test accuracy is measured after it.
  EpochMetrics train_epoch(const std::function<void(const StepInfo&)>& on_step = {});
  // Accuracy in eval mode (observers frozen). Full batches run on the training graph; the
  // last partial batch runs on a second instance of the model built at its size, holding
  // the same states, so every sample counts once and nothing is padded.
  double evaluate(const Dataset& data);
  // Logits for every row of `data` (eval mode), [n, classes] row-major.
  std::vector<float> predict(const Dataset& data);
  // Runs `batches` forward passes in training mode without optimizer steps, so observers
  // record the data's ranges (post-training quantization).
  void calibrate(const Dataset& data, int batches);
  // Copies every parameter value (buffers included) from `other` (same architecture).
  void copy_parameters_from(Trainer& other);

  // Mean wall time of one training step (forward, backward, optimizer) on a fixed batch,
  // after `warmup` untimed steps; the device is synchronised by a fetch before the clock
  // stops. Training state moves on: use a throwaway trainer.
  double time_steps(int warmup, int steps);

  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);
  // Loads from checkpoint bytes already in memory; `what` names them in errors. A failed
  // load leaves the trainer unchanged.
  void load_checkpoint_bytes(const std::string& bytes, const std::string& what);

  Graph& graph() { return graph_; }
  Executor& executor() { return *exec_; }
  const Model& model() const { return model_; }
  // Accuracy of the model converted to integer weights (nn/convert.h); `bytes` receives
  // its size.
  double integer_accuracy(const Dataset& data, int64_t* bytes);
  // Sets every batch norm's `frozen` state (running statistics stop updating).
  void freeze_batch_norms();
  const TrainConfig& config() const { return config_; }
  const std::vector<EpochMetrics>& history() const { return history_; }
  int epoch() const { return epoch_; }
  int64_t step() const { return step_; }

 private:
  void fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start, Tensor& x,
                  Tensor& labels) const;
  std::string config_key() const;

  TrainConfig config_;
  const Dataset& train_;
  const Dataset& test_;
  Graph graph_;
  Model model_;
  ModelInstance tail_;  // the model at the last partial batch's size (built on demand)
  std::vector<NodeId> steps_;
  std::unique_ptr<Executor> exec_;
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
