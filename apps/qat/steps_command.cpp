// `qat steps`: whole training steps, float and QAT, each forward + backward + optimizer
// compiled as every caller compiles it (runtime/compile.h) and replayed as one CUDA graph,
// median of `reps`. The PERF.md models:
//   cnn:          4 conv(3x3, pad 1)-bn-relu blocks, 64 channels, 3x32x32 input, batch 256,
//                 global average pool, linear 64 -> 10, cross-entropy;
//   transformer:  one pre-norm block (d=768, 12 heads, MLP 3072 with GELU), sequence 512,
//                 batch 8, a linear 768 -> 10 head on every token, cross-entropy;
//   llama:        the Llama-architecture decoder of bench/torch_llama_qat_bench.py (vocab
//                 32000, hidden 1024, intermediate 2816, 12 layers, 16 heads, 8 KV heads,
//                 untied lm_head: 207M parameters), batch 8 x 1024 tokens, Adam; its QAT row
//                 is torchao's 8da4w (per-token dynamic int8 activations, int4 weights in
//                 groups of 32), the recipe language models train with, or another of
//                 nn::parse_recipe's (--recipe, --group-size);
// and the digits models of `qat train` at its defaults (digits-mlp, digits-cnn,
// digits-transformer), which `qat train --time-steps` times through nn::Trainer.
// QAT is W8A8 (per-channel int8 weights, per-tensor uint8 activations with moving-average
// observers), the recipe torch.ao's default QAT qconfig applies; conv-bn pairs are folded as
// ConvBnReLU2d. bench/torch_model_steps.py times the same steps in PyTorch; --json rows use
// its case labels so bench/compare_steps.py can join them. `--small` shrinks every shape
// (a CPU smoke run for CI).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "apps/qat/commands.h"
#include "apps/qat/steps_common.h"
#include "apps/qat/steps_floors.h"
#include "apps/qat/train_common.h"
#include "bench/harness/device_timer.h"
#include "data/digits.h"
#include "nn/builder.h"
#include "nn/llama.h"
#include "nn/model.h"
#include "nn/rng.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/memory_plan.h"
#include "train/optimizer.h"

#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_allocator.h"
#include "device/cuda/cuda_check.h"
#endif

namespace qg::cli {
namespace {

struct StepsOptions {
  std::string device = "auto", model = "all", json;
  int reps = 20;
  bool small = false, profile = false, tf32 = false, wall = false, floors = false;
  bool recompute = false;          // llama: activation recomputation per decoder block
  DevicePeaks peaks;               // --floors
  std::string profile_nodes;       // comma-separated ops whose nodes are listed one by one
  std::string dump_graph;          // prefix of the files the compiled graphs are written to
  std::string variant = "both";    // float, qat or both
  bool no_trainer = false;         // digits: skip the in-process nn::Trainer column
  std::string precision = "f32";   // the llama step's PrecisionPolicy (nn::parse_precision)
  std::string recipe = "8da4w";    // the llama QAT row's recipe (nn::parse_recipe)
  std::string optimizer = "adam";  // the llama step's: adam or adamw
  int group_size = 32;             // of the group-wise recipes' weights
  bool integer_forward = false;    // the llama QAT row: QConfig::integer_forward
  // Data parallel (--model llama only; steps_distributed.cpp): --nproc local ranks, or the
  // torchrun variables of another launcher.
  int nproc = 1;
  bool no_grad_sync = false;
  double bucket_mb = 400;  // MiB: dist::kDefaultBucketBytes
  double dist_timeout = 60;
  std::string grad_reduce_dtype = "f32";
};

// `qat steps` as one rank of a data-parallel group (WORLD_SIZE > 1).
void run_steps_rank(const StepsOptions& o, dist::ProcessGroup& group) {
  QG_CHECK(o.model == "llama" && !o.profile && !o.tf32, "steps",
           "data-parallel timing (WORLD_SIZE ", group.world_size(),
           ") covers --model llama without --profile and --tf32, not --model ", o.model);
  DataParallelSteps d;
  d.device = o.device;
  d.variant = o.variant;
  d.precision = o.precision;
  d.recipe = o.recipe;
  d.group_size = o.group_size;
  d.reps = o.reps;
  d.small = o.small;
  d.wall = o.wall;
  d.recompute = o.recompute;
  d.grad_sync = !o.no_grad_sync;
  d.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
  QG_CHECK(d.bucket_bytes > 0, "steps", "--bucket-mb ", o.bucket_mb, " must be > 0");
  d.grad_reduce_dtype = dtype_from_name(o.grad_reduce_dtype);
  time_llama_data_parallel(group, d);
}

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  nn::Rng rng(seed);
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
  return t;
}

Tensor random_labels(int64_t n, int64_t classes, uint64_t seed) {
  nn::Rng rng(seed);
  Tensor t = Tensor::empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng.below(classes));
  return t;
}

void build_cnn(StepGraph& s, const nn::QConfig& qc, bool small) {
  const int64_t batch = small ? 4 : 256, image = small ? 8 : 32, channels = small ? 8 : 64;
  nn::Builder b(s.graph, qc, 1);
  ValueId x = s.graph.input("x", {DType::f32, {batch, 3, image, image}});
  ValueId labels = s.graph.input("labels", {DType::i64, {batch}});
  ValueId h = b.quant_input(x);
  for (int i = 0; i < 4; ++i)
    h = b.conv_bn(h, i == 0 ? 3 : channels, channels, 3, "block" + std::to_string(i), 1, 1,
                  /*relu=*/true);
  ValueId logits = b.linear(b.global_avg_pool(h, "gap"), 10, "head", false, true);
  s.loss = b.cross_entropy(logits, labels);
  s.parameters = b.parameters();
  s.feeds = {{"x", random_tensor({batch, 3, image, image}, 2)},
             {"labels", random_labels(batch, 10, 3)}};
}

void build_transformer(StepGraph& s, const nn::QConfig& qc, bool small) {
  const int64_t batch = small ? 2 : 8, seq = small ? 8 : 512, d = small ? 32 : 768;
  const int64_t heads = small ? 4 : 12, mlp = 4 * d;
  nn::Builder b(s.graph, qc, 1);
  ValueId x = s.graph.input("x", {DType::f32, {batch, seq, d}});
  ValueId labels = s.graph.input("labels", {DType::i64, {batch * seq}});
  ValueId h = b.transformer_block(b.quant_input(x), heads, mlp, "block");
  ValueId logits = b.linear(h, 10, "head", false, true);
  logits = s.graph.apply1("reshape", {logits}, {{"shape", Shape{batch * seq, 10}}}, "tokens");
  s.loss = b.cross_entropy(logits, labels);
  s.parameters = b.parameters();
  s.feeds = {{"x", random_tensor({batch, seq, d}, 2)},
             {"labels", random_labels(batch * seq, 10, 3)}};
}

}  // namespace

void build_llama_step(StepGraph& s, const nn::QConfig& qc, bool small,
                      const nn::PrecisionPolicy& precision, const std::string& optimizer,
                      bool recompute) {
  nn::LlamaConfig c;
  c.vocab_size = small ? 64 : 32000;
  c.hidden_size = small ? 32 : 1024;
  c.intermediate_size = small ? 64 : 2816;
  c.num_hidden_layers = small ? 2 : 12;
  c.num_attention_heads = small ? 4 : 16;
  c.num_key_value_heads = small ? 2 : 8;
  c.rms_norm_eps = 1e-5;
  const int64_t batch = small ? 2 : 8, seq = small ? 16 : 1024;
  nn::LlamaModel m = nn::build_llama(s.graph, c, batch, seq, qc, 1, precision);
  s.loss = m.loss;
  s.parameters = m.parameters;
  int64_t parameters = 0;
  for (ValueId p : m.parameters) parameters += shape_numel(s.graph.value(p).type.shape);
  s.tokens = batch * seq;
  s.model_flops = llama_model_flops(parameters, c.num_hidden_layers, batch, seq, c.hidden_size);
  if (recompute) s.recompute = m.blocks;
  s.optimizer = {"adam", 1e-4, 0.0};
  if (optimizer == "adamw") {
    s.optimizer.kind = "adamw";
    s.optimizer.weight_decay = 0.01;
  } else {
    QG_CHECK(optimizer == "adam", "steps", "llama optimizer '", optimizer, "': adam or adamw");
  }
  nn::Rng rng(5);
  Tensor ids = Tensor::empty({batch, seq}, DType::i64);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.data<int64_t>()[i] = static_cast<int64_t>(rng.below(c.vocab_size));
  s.feeds = {{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}};
}

namespace {

// The digits models `qat train` trains, at its default options (`--weight-bits 8 --act-bits
// 8` for QAT), on the batch `qat train --time-steps` times (the first rows of the training
// split), so that the two commands time the same compiled step on the same data.
void build_digits(StepGraph& s, const std::string& kind, bool qat) {
  TrainOptions o;
  o.model = kind;
  if (qat) o.weight_bits = o.act_bits = "8";
  const nn::TrainConfig config = make_config(o, qconfig_from(o));
  nn::Model m = nn::build_model(s.graph, config.spec(), config.qconfig, config.seed);
  s.loss = m.loss;
  s.parameters = m.parameters;
  s.optimizer = config.optimizer;
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  const int64_t batch = config.mlp.batch, features = train.features;
  Tensor x = Tensor::empty({batch, features}, DType::f32);
  Tensor labels = Tensor::empty({batch}, DType::i64);
  std::memcpy(x.data<float>(), train.x.data(), sizeof(float) * batch * features);
  std::memcpy(labels.data<int64_t>(), train.labels.data(), sizeof(int64_t) * batch);
  s.feeds = {{"x", x}, {"labels", labels}};
}

// The same step as nn::Trainer runs it for `qat train --time-steps` (mean wall time of
// back-to-back steps on the batch build_digits feeds), in this process, so the two paths are
// compared on one machine state.
double trainer_step_us(const std::string& kind, bool qat, Device device, int reps) {
  TrainOptions o;
  o.model = kind;
  o.device = device.is_cpu() ? "cpu" : "cuda";
  if (qat) o.weight_bits = o.act_bits = "8";
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  auto trainer = make_trainer(o, qconfig_from(o), train, test);
  return 1e6 * trainer->time_steps(std::max(3, reps / 10), reps);
}

// Compiles the step as every caller does (runtime/compile.h: passes, memory plan, CUDA
// graph) and returns the median microseconds of one step: a replay on CUDA, a StaticRun
// launch on the CPU. The feeds are written once; every step re-reads them.
// The CUDA caching allocator's bytes in use on `device` (0 on the CPU), and the most it held
// since the last reset_peak().
size_t device_bytes_in_use(Device device, bool peak) {
#ifdef QG_WITH_CUDA
  if (!device.is_cpu()) {
    cuda::CachingAllocator& a = cuda::allocator(device.index);
    return peak ? a.peak_bytes_in_use() : a.bytes_in_use();
  }
#endif
  (void)device;
  (void)peak;
  return 0;
}

void reset_device_peak(Device device) {
#ifdef QG_WITH_CUDA
  if (!device.is_cpu()) cuda::allocator(device.index).reset_peak();
#endif
  (void)device;
}

// Times one compiled step. `resident_bytes` gets, on CUDA, the most device memory the step
// held while it was timed: parameters, gradients, optimizer states, the memory plan's arena
// and the scratch pool, which a compiled step allocates once (torch.cuda.max_memory_allocated
// over training steps is the PyTorch figure to set it against). The executor's first,
// validated run allocates every value anew and is left out.
}  // namespace

double time_step(StepGraph& s, Device device, const ContextOptions& context, int reps, bool wall,
                 int* kernels, size_t* resident_bytes, const GradientSync& gradient_sync) {
  const size_t before = device_bytes_in_use(device, false);
  CompileOptions options;
  options.device = device;
  options.context = context;
  options.outputs = {s.loss};
  TrainingSpec training{s.loss, s.parameters, nn::optimizer_nodes(s.optimizer), gradient_sync};
  training.recompute = s.recompute;
  CompiledStep step(s.graph, training, options);
  if (!s.dump_path.empty()) {
    std::ofstream dump(s.dump_path);
    dump << step.graph().dump();
    QG_CHECK(dump.good(), "steps", "--dump-graph: cannot write '", s.dump_path, "'");
  }
  s.all_reduce_positions.clear();
  s.nodes_run = 0;
  step.executor().on_node = [&s](const Node& n, const std::vector<Tensor>&) {
    if (n.op->overlaps_async) s.all_reduce_positions.push_back(s.nodes_run);
    ++s.nodes_run;
  };
  step.train(s.feeds, {});  // the executor's validated run
  step.executor().on_node = nullptr;
  step.train({}, {});  // the first launch (records the temporaries)
  *kernels = step.kernels_per_launch({}, true, true);
  s.planned_arena = step.arena_bytes({}, true, true);
  s.updates = step.updates();
  reset_device_peak(device);
  struct ReadPeak {  // on every return below, after the timed steps
    Device device;
    size_t before;
    size_t* out;
    ~ReadPeak() {
      const size_t peak = device_bytes_in_use(device, true);
      *out = peak > before ? peak - before : 0;
    }
  } read_peak{device, before, resident_bytes};
  if (wall) {  // the mean over back-to-back steps, as nn::Trainer::time_steps measures it
    for (int i = 0; i < std::max(3, reps / 10); ++i) step.train({}, {});
    step.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) step.train({}, {});
    step.synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
               .count() /
           reps;
  }
  const double us = bench::median_us(
      step.executor().context(), [&](int) { step.train({}, {}); }, reps, device.is_cpu() ? 1 : -1);
  step.synchronize();
  return us;
}

namespace {

// The llama QAT row's QConfig: --recipe and --group-size, with --integer-forward.
nn::QConfig llama_recipe(const StepsOptions& o) {
  nn::QConfig qc = nn::parse_recipe(o.recipe, o.group_size);
  qc.integer_forward = o.integer_forward;
  qc.validate();
  return qc;
}

}  // namespace

void add_steps_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "steps", "Time whole training steps (CNN, transformer block), float and QAT W8A8");
  auto o = std::make_shared<StepsOptions>();
  cmd->add_option("--device", o->device, "cpu, cuda or auto (cuda when present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--model", o->model,
                  "cnn, transformer, all (both), llama (the 207M decoder; asked for by name "
                  "only), or a digits model of `qat train`: digits-mlp, "
                  "digits-cnn, digits-transformer, digits (all three)")
      ->check(CLI::IsMember({"cnn", "transformer", "all", "llama", "digits-mlp", "digits-cnn",
                             "digits-transformer", "digits"}));
  cmd->add_option("--reps", o->reps, "Timed steps (median reported)")->check(CLI::Range(1, 10000));
  cmd->add_flag("--small", o->small, "Tiny shapes (a smoke run)");
  cmd->add_flag("--wall", o->wall,
                "Report the mean wall time of back-to-back steps (as qat train --time-steps) "
                "instead of the median of per-step device times");
  cmd->add_option("--json", o->json, "Write the rows as JSON");
  cmd->add_flag("--profile", o->profile,
                "Also print each step's time per op (GPU time, or host wall time on the CPU)");
  cmd->add_flag("--floors", o->floors,
                "With --profile: each op's floor beside its time, the larger of its FLOPs at the "
                "peak rate and its bytes at the peak bandwidth (--peak-tflops, --peak-gbps)");
  cmd->add_option("--peak-tflops", o->peaks.tflops_16bit,
                  "--floors: dense bf16/f16 TFLOP/s of the device")
      ->capture_default_str();
  cmd->add_option("--peak-tflops-f32", o->peaks.tflops_f32, "--floors: f32 TFLOP/s without TF32")
      ->capture_default_str();
  cmd->add_option("--peak-gbps", o->peaks.gbps, "--floors: memory GB/s (H200: 4800)")
      ->capture_default_str();
  cmd->add_option("--dump-graph", o->dump_graph,
                  "Write each timed step's compiled graph (after the passes, every node with its "
                  "inputs and outputs) to PREFIX-<case>.txt");
  cmd->add_option("--profile-nodes", o->profile_nodes,
                  "With --profile on a GPU: also list every node of these ops (comma-separated)");
  cmd->add_option("--variant", o->variant,
                  "float, qat or both (default): one variant per process keeps each step's "
                  "timing free of the other's buffers and graphs")
      ->check(CLI::IsMember({"float", "qat", "both"}));
  cmd->add_flag("--no-trainer", o->no_trainer,
                "Digits models: do not also time nn::Trainer's step in this process");
  cmd->add_option("--precision", o->precision,
                  "The llama step's precision: f32 (default), bf16-mixed (f32 parameters, "
                  "bf16 GEMMs and attention, as torch.autocast) or f16-mixed");
  cmd->add_option("--recipe", o->recipe,
                  "The llama QAT row's recipe: 8da4w (default), 8da3w, 8da2w, int4_weight_only, "
                  "w8a8_dynamic")
      ->check(CLI::IsMember({"8da4w", "8da3w", "8da2w", "int4_weight_only", "w8a8_dynamic"}));
  cmd->add_option("--optimizer", o->optimizer,
                  "The llama step's optimizer: adam (default) or adamw (weight decay 0.01, the "
                  "runtime rate; its steps run as one multi-tensor node)")
      ->check(CLI::IsMember({"adam", "adamw"}));
  cmd->add_flag("--recompute", o->recompute,
                "--model llama: recompute each decoder block's activations in the backward "
                "(the planned arena of each llama row shows the saving)");
  cmd->add_option("--group-size", o->group_size,
                  "Weights per qparam of the llama recipe's groups: 32, 64, 128 or 256")
      ->check(CLI::IsMember({32, 64, 128, 256}));
  cmd->add_flag("--integer-forward", o->integer_forward,
                "--model llama: the QAT row's forward GEMMs run on int8 codes (int8_matmul_ste, "
                "the deployed arithmetic) instead of the fake-quantized bf16/f32 operands; "
                "8da4w, 8da3w, 8da2w and w8a8_dynamic");
  cmd->add_flag("--tf32", o->tf32,
                "Also time each step with TF32 GEMMs and convolutions (rows labelled tf32)");
  cmd->add_option("--nproc", o->nproc,
                  "--model llama: data-parallel ranks started on this host (one per GPU with "
                  "--device cuda), each timing the step with its own batch and the gradient "
                  "all-reduce")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--no-grad-sync", o->no_grad_sync,
                "Data parallel: time the step without the gradient all-reduce (no "
                "communication), to estimate how much of the all-reduce the backward pass hides");
  cmd->add_option(
         "--bucket-mb", o->bucket_mb,
         "Data parallel: gradient all-reduce bucket size in MiB (docs/DISTRIBUTED.md: why 400)")
      ->capture_default_str();
  cmd->add_option("--grad-reduce-dtype", o->grad_reduce_dtype,
                  "Data parallel: the dtype gradients are all-reduced in (bf16/f16: half the "
                  "bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "Data parallel: seconds a collective waits before every rank fails")
      ->capture_default_str();
  cmd->callback([o] {
    QG_CHECK(!o->recompute || o->model == "llama", "steps",
             "--recompute recomputes the decoder blocks of --model llama, not --model ", o->model);
    if (o->nproc > 1 || std::getenv("WORLD_SIZE") != nullptr) {
      QG_CHECK(o->model == "llama", "steps",
               "--nproc and the torchrun variables time --model "
               "llama only, not --model ",
               o->model);
      if (starts_ranks(o->nproc)) {
        run_launcher(o->nproc, o->dist_timeout, "steps");
        return;
      }
      if (std::unique_ptr<dist::ProcessGroup> group = join_group(o->dist_timeout)) {
        run_reporting_failures(group.get(), [&] { run_steps_rank(*o, *group); });
        return;
      }
    }
    Device device = Device::cpu();
    if (o->device == "cuda" || (o->device == "auto" && cuda_available())) device = Device::cuda();
    auto backend = make_backend(device);
    std::printf("qat steps on %s (%s shapes), median of %d steps (f32%s)\n", device.str().c_str(),
                o->small ? "small" : "PERF.md", o->reps,
                o->tf32 ? "; fp32 rows without TF32, tf32 rows with it" : ", no TF32");
    std::printf("%-32s %8s %12s\n", "case", "kernels", "ms");
    std::string rows;
    for (const std::string kind :
         {"cnn", "transformer", "llama", "digits-mlp", "digits-cnn", "digits-transformer"}) {
      const bool digits = kind.rfind("digits-", 0) == 0;
      const bool by_name_only = kind == "llama";
      if (o->model != kind && !(o->model == "all" && !digits && !by_name_only) &&
          !(o->model == "digits" && digits))
        continue;
      for (bool tf32 : {false, true})
        for (bool qat : {false, true}) {
          if (tf32 && !o->tf32) continue;
          if (o->variant != "both" && qat != (o->variant == "qat")) continue;
          ContextOptions context;  // TF32 for the GEMMs and convolutions of this row only
          context.precision.allow_tf32 = tf32;
          StepGraph s;
          nn::QConfig qc = qat ? nn::QConfig::w8a8() : nn::QConfig::float32();
          if (digits)
            build_digits(s, kind.substr(7), qat);
          else if (kind == "llama")
            build_llama_step(s, qat ? llama_recipe(*o) : qc, o->small,
                             nn::parse_precision(o->precision), o->optimizer, o->recompute);
          else if (kind == "cnn")
            build_cnn(s, qc, o->small);
          else
            build_transformer(s, qc, o->small);
          if (!o->dump_graph.empty())
            s.dump_path = o->dump_graph + "-" + kind + (qat ? "-qat" : "-float") +
                          (tf32 ? "-tf32" : "") + ".txt";
          int kernels = 0;
          size_t resident = 0;
          double us = time_step(s, device, context, o->reps, o->wall, &kernels, &resident);
          // The default recipe keeps its row's name; others are named in it (with their
          // group size, which w8a8_dynamic's per-channel weights do not have).
          const bool named_recipe = o->recipe != "8da4w" || o->group_size != 32;
          const std::string recipe_label =
              o->recipe + (o->recipe == "w8a8_dynamic" ? "" : "/" + std::to_string(o->group_size));
          std::string label = std::string("step ") + kind + (qat ? " qat" : " float") +
                              (kind == "llama" && qat && named_recipe ? " " + recipe_label : "") +
                              (kind == "llama" && o->precision != "f32" ? " " + o->precision
                               : tf32                                   ? " tf32"
                                                                        : " fp32") +
                              (kind == "llama" && o->recompute ? " recompute" : "");
          std::printf("%-32s %8d %12.3f", label.c_str(), kernels, us / 1000.0);
          if (digits && !tf32 &&
              !o->no_trainer)  // the trainer's own step, for `qat train --time-steps`
            std::printf("   nn::Trainer %.3f ms",
                        trainer_step_us(kind.substr(7), qat, device, o->reps) / 1000.0);
          // Last on the row, so the columns scripts read stay where they were.
          if (resident > 0) std::printf("   resident %.2f GiB", resident / 1073741824.0);
          if (kind == "llama")
            std::printf("   planned arena %s", format_bytes(s.planned_arena).c_str());
          if (s.tokens > 0 && us > 0) {
            // MFU against the 16-bit tensor-core peak for mixed precision, else f32's.
            const double peak = o->precision == "f32" ? o->peaks.tflops_f32 : o->peaks.tflops_16bit;
            std::printf("   tokens/s %.0f   MFU %.1f%% of %.0f TFLOP/s",
                        static_cast<double>(s.tokens) / (us * 1e-6),
                        100.0 * s.model_flops / (us * 1e-6) / (peak * 1e12), peak);
          }
          std::printf("\n");
          std::fflush(stdout);
          if (o->profile)
            profile_step(s, device, context, 5, o->profile_nodes, o->floors ? &o->peaks : nullptr);
          rows += std::string(rows.empty() ? "" : ",\n") + "  {\"case\": \"" + label +
                  "\", \"ours_us\": " + std::to_string(us) +
                  ", \"kernels\": " + std::to_string(kernels) +
                  ", \"resident_bytes\": " + std::to_string(resident) + "}";
        }
    }
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      f << "[\n" << rows << "\n]\n";
      QG_CHECK(f.good(), "steps", "could not write ", o->json);
    }
  });
}

}  // namespace qg::cli
