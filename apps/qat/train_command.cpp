// `qat train`: end-to-end QAT of an MLP on the UCI digits data. One configuration trains
// with a live progress display and writes metrics (JSON, CSV), loss/accuracy curves (PNG),
// checkpoints, and the accuracy of the converted integer-weight model. `--compare` trains
// float32, PTQ and QAT variants and prints one table. `--init` starts from imported
// float weights (nn/import_weights.h; README "Importing float weights" for the semantics).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "apps/qat/commands.h"
#include "apps/qat/train_common.h"
#include "core/safetensors.h"
#include "nn/quantized.h"
#include "runtime/distributed/launch.h"
#include "runtime/distributed/process_group.h"
#include "train/checkpoint.h"
#include "train/png_plot.h"

namespace qg::cli {
namespace {

// Times one training step at the configured batch (a fresh model; nothing is written).
void run_timing(const TrainOptions& o) {
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  nn::QConfig qc = qconfig_from(o);
  auto t = make_trainer(o, qc, train, test);
  double secs = t->time_steps(20, o.time_steps);
  std::printf(
      "one training step (forward + backward + %s), %s, %s, batch %d, %s: "
      "%.1f us (mean of %d steps after 20 warm-up)\n",
      o.optimizer.c_str(), qc.str().c_str(), t->config().spec().str().c_str(), o.batch,
      t->executor().device().str().c_str(), 1e6 * secs, o.time_steps);
  if (o.comm != nullptr)
    std::printf("rank %d of %d: optimizer state %lld bytes%s; observer statistics through %s\n",
                o.comm->rank(), o.comm->world_size(),
                static_cast<long long>(t->optimizer_state_bytes()),
                o.zero1 ? " (its share: --zero1)" : "", o.comm->peer_mailbox_status().c_str());
}

void run_single(const TrainOptions& o) {
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  nn::QConfig qc = qconfig_from(o);
  auto t = make_trainer(o, qc, train, test);
  ensure_dir(o.out);
  if (!o.resume.empty()) {
    t->load_checkpoint(o.resume);
    std::printf("resumed from %s at epoch %d (step %lld)\n", o.resume.c_str(), t->epoch(),
                static_cast<long long>(t->step()));
  }
  std::printf("qat train: %s, %s, %s lr %g, batch %d, %d epochs, seed %llu, %s\n", qc.str().c_str(),
              t->config().spec().str().c_str(), o.optimizer.c_str(), o.lr, o.batch, o.epochs,
              static_cast<unsigned long long>(o.seed), t->executor().device().str().c_str());
  std::printf("data: %lld train / %lld test rows\n", static_cast<long long>(train.size()),
              static_cast<long long>(test.size()));
  if (o.comm != nullptr)
    std::printf(
        "data parallel: rank %d of %d (%s), global batch %d, optimizer state %lld bytes%s; "
        "observer statistics through %s\n",
        o.comm->rank(), o.comm->world_size(), o.comm->backend().c_str(),
        o.batch * o.comm->world_size(), static_cast<long long>(t->optimizer_state_bytes()),
        o.zero1 ? " (this rank's share: --zero1)" : "", o.comm->peer_mailbox_status().c_str());
  if (!o.init.empty()) {
    import_init(o, *t, true);
    if (!qc.quantized())
      std::printf("test accuracy of the imported weights: %s\n", pct(t->evaluate(test)).c_str());
  }
  const std::string checkpoint =
      (o.checkpoint_dir.empty() ? o.out : o.checkpoint_dir) + "/checkpoint.qgck";
  if (!o.init.empty() && o.epochs == 0 && qc.quantized()) {
    // PTQ of the imported model: observers see the whole training set once; the batch norms
    // keep the imported running statistics.
    t->freeze_batch_norms();
    t->calibrate(train, static_cast<int>(train.size() / o.batch));
    std::printf("calibrated (post-training quantization) on %lld training rows\n",
                static_cast<long long>(train.size() / o.batch * o.batch));
  }
  run_training(*t, o.epochs, qc.quantized() ? "qat" : "float", checkpoint, o.checkpoint_every,
               true);
  t->save_checkpoint(checkpoint);  // the final state, resumable with --resume
  Row r = evaluate_row(qc.str(), *t, test);
  std::printf("test accuracy (fake-quant graph): %s\n", pct(r.fake_quant_acc).c_str());
  if (r.integer_acc >= 0)
    std::printf("test accuracy (integer weights, converted graph): %s  (difference %+.2f points)\n",
                pct(r.integer_acc).c_str(), 100 * (r.integer_acc - r.fake_quant_acc));
  std::printf("model size: %lld bytes\n", static_cast<long long>(r.bytes));
  if (!o.save_logits.empty()) {
    // The test split in order, eval mode, through the fake-quant graph.
    std::vector<float> logits = t->predict(test);
    const int64_t n = test.size(), classes = static_cast<int64_t>(logits.size()) / n;
    save_safetensors(o.save_logits, {{"logits", Tensor::from_vector<float>({n, classes}, logits)},
                                     {"labels", Tensor::from_vector<int64_t>({n}, test.labels)}});
    std::printf("wrote the test logits to %s\n", o.save_logits.c_str());
  }
  std::ostringstream extra;
  extra.precision(9);
  extra << "  \"config\": \"" << json_escape(qc.str()) << "\",\n  \"seed\": " << o.seed
        << ",\n  \"test_accuracy\": " << r.fake_quant_acc
        << ",\n  \"integer_test_accuracy\": " << (r.integer_acc >= 0 ? r.integer_acc : 0.0)
        << ",\n  \"model_bytes\": " << r.bytes;
  write_metrics(o.out, "metrics", r.history, extra.str());
  std::vector<double> loss, acc, train_acc;
  for (const auto& m : r.history) {
    loss.push_back(m.train_loss);
    acc.push_back(100 * m.test_accuracy);
    train_acc.push_back(100 * m.train_accuracy);
  }
  nn::write_plot_png(
      o.out + "/curves.png",
      {{"LOSS", {{"TRAIN", loss}}}, {"ACCURACY (PCT)", {{"TRAIN", train_acc}, {"TEST", acc}}}});
  std::printf("wrote %s/metrics.json, metrics.csv, curves.png, checkpoint.qgck\n", o.out.c_str());
}

// The training run of this process, as one rank of its group when the torchrun variables
// say so: a failure is reported to the group (so the other ranks name this one) and raised.
void run_rank(TrainOptions o) {
  const char* world = std::getenv("WORLD_SIZE");
  QG_CHECK(!o.compare || world == nullptr || std::string(world) == "1", "train",
           "--compare trains several models one after the other; run it "
           "in one process");
  std::unique_ptr<dist::ProcessGroup> group = join_group(o.dist_timeout);
  if (group) bind_rank(o, *group);
  run_reporting_failures(group.get(), [&] {
    if (o.time_steps > 0)
      run_timing(o);
    else if (o.compare)
      run_compare(o);
    else
      run_single(o);
  });
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("train",
                         "Train a QAT MLP, CNN or transformer on the UCI digits data, or a Llama "
                         "decoder on the Python documentation (--model llama)");
  auto o = std::make_shared<TrainOptions>();
  add_model_options(cmd, *o);
  cmd->add_option("--lr", o->lr, "Learning rate")->capture_default_str();
  cmd->add_option("--epochs", o->epochs, "Epochs")->capture_default_str();
  cmd->add_flag("--keep-last", o->keep_last,
                "Train on each epoch's last partial batch too (a step compiled at its size); "
                "by default it is dropped");
  cmd->add_option("--seed", o->seed, "Seed for init and data order")->capture_default_str();
  cmd->add_option("--device", o->device, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--out", o->out, "Output directory")->capture_default_str();
  cmd->add_option(
      "--data", o->data,
      "digits.csv.gz (default: $QG_DIGITS_CSV, then python3-sklearn's copy); llama: the "
      "folder that holds or receives the tokenizer model and token cache");
  cmd->add_option("--resume", o->resume, "Resume from a checkpoint file");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Save <out>/checkpoint.qgck every N epochs (llama: steps; 0: never)")
      ->capture_default_str();
  cmd->add_option("--init", o->init,
                  "Start from pretrained float weights (.safetensors or .npz; PyTorch state_dict "
                  "names are mapped, README 'Importing float weights')");
  cmd->add_option("--init-map", o->init_map,
                  "FILE_NAME=MODEL_NAME renames for --init (repeatable; empty MODEL_NAME ignores)");
  cmd->add_option("--save-logits", o->save_logits,
                  "Write the test split's logits and labels to this safetensors file");
  cmd->add_flag("--compare", o->compare, "Train float32, PTQ and QAT variants; print one table");
  cmd->add_option("--qat-epochs", o->qat_epochs, "--compare: QAT fine-tuning epochs")
      ->capture_default_str();
  cmd->add_option("--qat-lr", o->qat_lr, "--compare: QAT fine-tuning learning rate")
      ->capture_default_str();
  cmd->add_option("--seeds", o->seeds, "--compare: seeds to average over")->capture_default_str();
  cmd->add_option("--time-steps", o->time_steps,
                  "Only time N training steps on one batch and print the mean step time");
  cmd->add_option("--nproc", o->nproc,
                  "Data-parallel ranks started on this host (one per GPU with --device cuda); "
                  "--batch is per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "Seconds a collective (or --nproc, after one rank failed) waits before every "
                  "rank fails naming the rank (QG_DIST_TIMEOUT overrides)")
      ->capture_default_str();
  cmd->add_flag("--no-sync-observers", o->no_sync_observers,
                "Data parallel: each rank keeps its own observer statistics (as DDP does)");
  cmd->add_flag("--no-sync-bn", o->no_sync_bn,
                "Data parallel: batch norms use each rank's batch statistics (no SyncBatchNorm)");
  cmd->add_flag("--zero1", o->zero1,
                "Data parallel: each rank keeps the optimizer state of its share of the "
                "parameters and the updated parameters are all-gathered (ZeRO stage 1)");
  cmd->add_option(
         "--bucket-mb", o->bucket_mb,
         "Data parallel: gradient all-reduce bucket size in MiB (docs/DISTRIBUTED.md: why 400)")
      ->capture_default_str();
  cmd->add_option("--grad-reduce-dtype", o->grad_reduce_dtype,
                  "Data parallel: the dtype gradients are all-reduced in (bf16/f16: half the "
                  "bytes, each partial sum rounded to it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--config", o->llama_config, "llama: the model's Hugging Face config.json");
  cmd->add_option("--corpus", o->corpus,
                  "llama: folder of .rst.txt files (default: python3.11-doc's _sources)");
  cmd->add_option("--steps", o->steps, "llama: optimizer steps")->capture_default_str();
  cmd->add_option("--seq", o->seq, "llama: tokens per window")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "llama: learning-rate warm-up steps")
      ->capture_default_str();
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio,
                  "llama: the cosine schedule's final rate, as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "llama: steps between validation passes")
      ->capture_default_str();
  cmd->add_option("--eval-windows", o->eval_windows,
                  "llama: validation windows per pass (0: every window of the split)")
      ->capture_default_str();
  cmd->add_option("--recipes", o->recipes,
                  "llama --compare: the recipes (comma-separated; default 8da4w, "
                  "int4_weight_only, w8a8_dynamic, 8da3w, 8da2w)")
      ->delimiter(',');
  cmd->add_option("--qat-steps", o->qat_steps,
                  "llama --compare: steps of each fine-tune (QAT and the float reference)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay,
                  "llama: weight decay (adamw: decoupled, p *= 1 - lr * wd; adam, sgd: L2)")
      ->capture_default_str();
  cmd->add_option("--clip-grad-norm", o->clip_grad_norm,
                  "llama: clip the gradients' total L2 norm to this (adam, adamw; 0: off)")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "llama: f32 or bf16-mixed (f32 parameters and optimizer states, bf16 GEMMs "
                  "and attention, f32 accumulation)")
      ->capture_default_str();
  cmd->add_option("--embedding-quant", o->embedding_quant,
                  "llama: the token embedding's codes with torchao's embedding QAT: none, int8 "
                  "or int4 (symmetric per group along the hidden dim; tied embeddings share "
                  "lm_head's quantizer)")
      ->capture_default_str();
  cmd->add_option("--embedding-group-size", o->embedding_group_size,
                  "llama: embedding weights per scale along the hidden dim (must divide it)")
      ->capture_default_str();
  cmd->add_flag("--recompute", o->recompute,
                "llama: recompute each decoder block's activations in the backward instead of "
                "keeping them (the same values, a lower peak memory)");
  cmd->callback([o, cmd] {
    QG_CHECK(o->model == "llama" ||
                 (cmd->count("--weight-decay") == 0 && cmd->count("--clip-grad-norm") == 0 &&
                  cmd->count("--precision") == 0 && cmd->count("--recompute") == 0),
             "train",
             "--weight-decay, --clip-grad-norm, --precision and --recompute are for --model "
             "llama");
    QG_CHECK(o->model == "llama" || (cmd->count("--embedding-quant") == 0 &&
                                     cmd->count("--embedding-group-size") == 0),
             "train", "--embedding-quant and --embedding-group-size are for --model llama");
    if (o->model == "llama") {
      // The digits defaults do not fit a language model: a smaller batch, a smaller rate.
      if (cmd->count("--batch") == 0) o->batch = 8;
      if (cmd->count("--lr") == 0) o->lr = 1e-3;
      if (cmd->count("--qat-lr") == 0) o->qat_lr = o->lr / 10;
      if (cmd->count("--seeds") == 0) o->seeds = 1;
      run_llama_training(*o);
      return;
    }
    apply_model_defaults(*o, [cmd](const char* option) { return cmd->count(option) > 0; });
    if (starts_ranks(o->nproc))
      run_launcher(o->nproc, o->dist_timeout, "train");
    else
      run_rank(*o);
  });
}

}  // namespace qg::cli
