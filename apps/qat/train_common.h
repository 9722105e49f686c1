// Shared pieces of `qat train`: options, device choice, the progress display, the training
// loop with checkpoints, and the metrics writers (JSON, CSV, PNG).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "train/lm_trainer.h"
#include "train/trainer.h"

namespace qg::cli {

struct TrainOptions {
  std::string model = "mlp";  // mlp, cnn, transformer
  int width = 128;
  int depth = 1;
  std::string weight_bits = "32";  // 32, 8, 4, nf4
  std::string act_bits = "32";     // 32, 8
  std::string scope = "channel";
  int group_size = 32;
  std::string observer = "moving_average";
  // --recipe: a named language-model recipe (nn::parse_recipe) in place of --weight-bits,
  // --act-bits and --scope; its group size is --group-size. Else the weight qparams come
  // from observers unless dynamic_weights (checkpoints of dynamic recipes set it).
  std::string recipe;
  bool dynamic_weights = false;
  bool learned_ranges = false;           // --learned-ranges: QConfig::learned_weight_ranges (llama)
  bool integer_forward = false;          // --integer-forward: QConfig::integer_forward (llama)
  double learned_range_lr_factor = 1.0;  // --learned-ranges-lr-factor
  std::string weight_mapping = "symmetric";
  std::string optimizer = "adam";
  double lr = 3e-3;
  int epochs = 30;
  int batch = 64;
  bool keep_last = false;  // train on the last partial batch too (compiled at its size)
  uint64_t seed = 1;
  std::string device = "auto";
  std::string out = "out/train";
  std::string data;
  std::string resume;
  int checkpoint_every = 0;
  bool compare = false;
  int time_steps = 0;  // > 0: only time this many training steps
  // --compare: QAT fine-tunes the float model for qat_epochs at qat_lr; results are the
  // mean over `seeds` seeds (seed, seed + 1, ...).
  int qat_epochs = 10;
  double qat_lr = 3e-4;
  int seeds = 5;
  int64_t freeze_bn_after = -1;                  // optimizer steps; < 0: never
  std::vector<int64_t> channels = {16, 32, 32};  // cnn
  int64_t d_model = 32, heads = 4, blocks = 1;   // transformer
  // --init: pretrained float weights (safetensors or .npz) imported before training
  // (nn/import_weights.h), with extra FILE=MODEL renames (MODEL empty: ignore FILE).
  std::string init;
  std::vector<std::string> init_map;
  std::string save_logits;  // single runs: the test split's logits as safetensors
  // Data parallelism (runtime/distributed/): --nproc starts that many local ranks; a process
  // started with the torchrun variables (RANK, WORLD_SIZE, ...) is one rank of a group, and
  // --batch is then the batch of each rank.
  int nproc = 1;
  double dist_timeout = 60;  // seconds a collective may wait before every rank fails
  bool no_sync_observers = false;
  bool no_sync_bn = false;
  bool zero1 = false;                     // shard the optimizer state over the ranks (ZeRO stage 1)
  double bucket_mb = 400;                 // MiB: dist::kDefaultBucketBytes
  std::string grad_reduce_dtype = "f32";  // f32, bf16 or f16
  Communicator* comm = nullptr;           // set once this process has joined its group
  int local_rank = 0;
  std::string checkpoint_dir;  // where checkpoint.qgck goes; empty: out
  // --model llama (apps/qat/train_llama.cpp): the Hugging Face config.json, the corpus
  // folder (empty: python3.11-doc's sources), optimizer steps, tokens per window, warm-up
  // steps, the cosine floor, and the evaluation interval and window cap (0: all windows).
  std::string llama_config;
  std::string corpus;
  int64_t steps = 300, seq = 64, warmup = 30, eval_every = 100, eval_windows = 0;
  double min_lr_ratio = 0.1;
  // --model llama --compare (apps/qat/train_llama_compare.cpp): the recipes (empty: all
  // quantized ones) and the fine-tune's steps; --qat-lr defaults to a tenth of --lr there.
  std::vector<std::string> recipes;
  int64_t qat_steps = 100;
  double weight_decay = 0.0, clip_grad_norm = 0.0;  // llama's optimizer (0: off)
  std::string precision = "f32";                    // llama: nn::parse_precision
  // llama: the token embedding's codes (nn::parse_embedding_quant: none, int8, int4) and
  // their group size along the hidden dim (nn/llama_embedding.h).
  std::string embedding_quant = "none";
  int embedding_group_size = 32;
  bool recompute = false;  // llama: activation recomputation per decoder block
};

// The result of one trained (or calibrated) model.
struct Row {
  std::string name;
  double fake_quant_acc = 0, integer_acc = -1;  // integer_acc < 0: not quantized
  double float_integer_acc = -1;  // float rows: accuracy of the converted graph (BN folded)
  int64_t bytes = 0;
  std::vector<nn::EpochMetrics> history;
};

nn::QConfig qconfig_from(const TrainOptions& o);
// The options that define the model and its recipe (--model ... --optimizer, --batch): what a
// checkpoint must match. `qat train` and `qat export` share them.
void add_model_options(CLI::App* cmd, TrainOptions& o);
// Checks --model and fills the per-kind defaults (epochs, learning rates) of the options the
// user did not give (`given("--epochs")`). With --init, a single run fine-tunes (epochs and
// lr default to --qat-epochs and --qat-lr; --epochs 0 with a quantized recipe is PTQ, whose
// observers default to minmax) and --compare starts from the imported weights as they are
// (--epochs defaults to 0).
void apply_model_defaults(TrainOptions& o, const std::function<bool(const char*)>& given);
// Accuracy of the fake-quant graph and of the converted integer-weight model, and its size.
Row evaluate_row(const std::string& name, nn::Trainer& t, const nn::Dataset& test);
std::string pct(double a);
void run_compare(const TrainOptions& o);

// Imports o.init into the trainer's parameters and buffers; prints what was imported when
// `verbose`.
void import_init(const TrainOptions& o, nn::Trainer& t, bool verbose);

nn::TrainConfig make_config(const TrainOptions& o, const nn::QConfig& qc);
// Builds the trainer on the requested device; "auto" prefers CUDA and falls back to the
// CPU (saying why) when there is no GPU or an op lacks a CUDA kernel.
std::unique_ptr<nn::Trainer> make_trainer(const TrainOptions& o, const nn::QConfig& qc,
                                          const nn::Dataset& train, const nn::Dataset& test);

// Trains until `epochs` epochs are done, with a live progress line (a TTY gets an
// in-place bar; otherwise, when `epoch_lines`, one line per epoch), saving a checkpoint
// every `checkpoint_every` epochs when `checkpoint` is not empty.
void run_training(nn::Trainer& t, int epochs, const std::string& label,
                  const std::string& checkpoint, int checkpoint_every, bool epoch_lines);

// `qat train --model llama`: trains on the text corpus (o.data is the tokenizer and token
// cache folder). checkpoint_every counts steps.
void run_llama_training(const TrainOptions& o);
// The LmTrainer settings of --model llama: every run of it (single or --compare) trains so.
nn::LmTrainConfig llama_train_config(const TrainOptions& o, const nn::LlamaConfig& model);
void run_llama_compare(const TrainOptions& o);

// Data parallelism, shared by `qat train` (every model) and `qat steps`.
// Whether this process starts the ranks itself: --nproc > 1 and no launcher's WORLD_SIZE.
bool starts_ranks(int nproc);
// --nproc N: this process's command line, less --nproc, started N times on this host with the
// torchrun variables (dist::launch_local); returns once every rank has exited, throwing naming
// the first that failed. After a failure the others get `dist_timeout` seconds to fail on
// their own. `command` ("train", "steps") names the subcommand in messages and errors.
void run_launcher(int nproc, double dist_timeout, const std::string& command);
// The group the torchrun variables describe when WORLD_SIZE > 1 (null otherwise); the
// collectives time out after `dist_timeout` seconds unless QG_DIST_TIMEOUT says otherwise.
std::unique_ptr<dist::ProcessGroup> join_group(double dist_timeout);
// Makes `o` this rank's options: the communicator of o.device's kind (NCCL on cuda:LOCAL_RANK,
// Gloo on the CPU), o.local_rank, o.device ("cuda" or "cpu"), and for rank > 0 its own output
// folder OUT/rankR (checkpoint_dir stays OUT: rank 0 writes the checkpoints).
void bind_rank(TrainOptions& o, dist::ProcessGroup& group);
// Runs `body`; a failure is reported to `group` (when there is one), so that the other ranks
// name this one, and rethrown.
void run_reporting_failures(dist::ProcessGroup* group, const std::function<void()>& body);

void write_metrics(const std::string& dir, const std::string& stem,
                   const std::vector<nn::EpochMetrics>& history, const std::string& extra_json);
void ensure_dir(const std::string& dir);
std::string json_escape(const std::string& s);

}  // namespace qg::cli
