// `qat export --onnx model.onnx CHECKPOINT`: the trained model of a `qat train` checkpoint,
// converted to integer weights (nn/convert.h), as an ONNX QDQ model (export/onnx/). The
// checkpoint names its model and recipe; model options given on the command line override
// them (and must then match the checkpoint, which is checked when it loads). Checkpoints
// written before they named their model take the options as given (`qat train`'s defaults).
// `--reference DIR` also writes the digits test split's inputs, labels and the converted
// graph's logits as .npy files, for scripts/onnx_check.py. A `qat train --model llama`
// checkpoint goes to apps/qat/export_llama.cpp (opset 21, INT4 weights, a greedy-decode
// reference for scripts/onnx_llm_check.py).
#include <cstdio>

#include "apps/qat/commands.h"
#include "apps/qat/export_llama.h"
#include "apps/qat/train_common.h"
#include "core/error.h"
#include "core/npy.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

#ifdef QG_WITH_ONNX
#include "export/onnx/onnx_export.h"
#endif

namespace qg::cli {
namespace {

struct ExportOptions {
  std::string checkpoint, onnx, reference;
};

#ifdef QG_WITH_ONNX
std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> v;
  if (s == "none") return v;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    size_t used = 0;
    v.push_back(std::stoll(s.substr(start, end - start), &used));
    if (used != end - start) throw std::invalid_argument(s);
    start = end + 1;
  }
  return v;
}

// Model options from the checkpoint's description, where the command line gave none.
void options_from_meta(const std::map<std::string, std::string>& meta, const std::string& path,
                       TrainOptions& o, const std::function<bool(const char*)>& given) {
  auto take = [&](const char* key, const char* option,
                  const std::function<void(const std::string&)>& set) {
    auto it = meta.find(key);
    if (it == meta.end() || given(option)) return;
    try {
      set(it->second);
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {  // std::stoll's
      QG_FAIL("export", "checkpoint ", path, ": meta '", key, "' = '", it->second,
              "' is not valid");
    }
  };
  auto to_int = [](const std::string& s) { return int_list(s).at(0); };
  take("model", "--model", [&](const std::string& s) { o.model = s; });
  take("hidden", "--depth", [&](const std::string& s) {
    std::vector<int64_t> h = int_list(s);
    for (int64_t w : h)
      QG_CHECK(w == h[0], "export", "checkpoint ", path, ": hidden layers ", s,
               " differ in width; qat train gives them all --width");
    o.depth = static_cast<int>(h.size());
    if (!h.empty() && !given("--width")) o.width = static_cast<int>(h[0]);
  });
  take("channels", "--channels", [&](const std::string& s) { o.channels = int_list(s); });
  take("d_model", "--d-model", [&](const std::string& s) { o.d_model = to_int(s); });
  take("heads", "--heads", [&](const std::string& s) { o.heads = to_int(s); });
  take("blocks", "--blocks", [&](const std::string& s) { o.blocks = to_int(s); });
  take("weight", "--weight-bits", [&](const std::string& s) { o.weight_bits = s; });
  take("activation", "--act-bits", [&](const std::string& s) { o.act_bits = s; });
  take("observer", "--observer", [&](const std::string& s) { o.observer = s; });
  take("scope", "--scope", [&](const std::string& s) { o.scope = s; });
  take("group_size", "--group-size", [&](const std::string& s) { o.group_size = int(to_int(s)); });
  take("weight_qparams", "--recipe",
       [&](const std::string& s) { o.dynamic_weights = s == "dynamic"; });
  take("weight_mapping", "--recipe", [&](const std::string& s) { o.weight_mapping = s; });
  take("optimizer", "--optimizer", [&](const std::string& s) { o.optimizer = s; });
  take("batch", "--batch", [&](const std::string& s) { o.batch = int(to_int(s)); });
  take("freeze_bn_after", "--freeze-bn-after",
       [&](const std::string& s) { o.freeze_bn_after = to_int(s); });
}

void write_reference(const std::string& dir, const nn::Dataset& test,
                     const std::vector<float>& logits, int64_t classes) {
  ensure_dir(dir);
  save_npy(dir + "/inputs.npy", Tensor::from_vector<float>({test.size(), test.features}, test.x));
  save_npy(dir + "/labels.npy", Tensor::from_vector<int64_t>({test.size()}, test.labels));
  save_npy(dir + "/logits.npy", Tensor::from_vector<float>({test.size(), classes}, logits));
}
#endif

void run_export(const ExportOptions& e, TrainOptions o, LlamaExportOptions l,
                const std::function<bool(const char*)>& given) {
#ifndef QG_WITH_ONNX
  (void)e;
  (void)o;
  (void)l;
  (void)given;
  QG_FAIL("export",
          "this qat was built without ONNX support: CMake found no libonnx-dev / "
          "libprotobuf-dev (scripts/install_deps.sh installs them; then rebuild)");
#else
  // 1. The model the checkpoint holds, loaded on the CPU (a checkpoint of another model, or a
  //    damaged one, fails here, before anything is written).
  std::map<std::string, std::string> meta = nn::read_checkpoint_meta(e.checkpoint);
  if (is_llama_checkpoint(meta)) {
    l.checkpoint = e.checkpoint;
    l.onnx = e.onnx;
    l.reference = e.reference;
    l.data = o.data;
    run_llama_export(l, meta);
    return;
  }
  if (meta.count("model") != 0)
    options_from_meta(meta, e.checkpoint, o, given);
  else
    std::printf(
        "note: %s does not name its model (an older checkpoint): using the model "
        "options as given\n",
        e.checkpoint.c_str());
  o.device = "cpu";
  nn::Dataset all = nn::load_digits(o.data), train, test;
  nn::split_dataset(all, 0.2, 0, &train, &test);
  nn::QConfig qc = qconfig_from(o);
  auto t = make_trainer(o, qc, train, test);
  t->load_checkpoint(e.checkpoint);
  // 2. Converted to integer weights at the test split's size; its logits are the reference.
  nn::ModelInstance inst = nn::build_instance(t->config().spec(), test.size(), qc, Device::cpu());
  nn::copy_states(t->executor(), *inst.exec);
  const int64_t bytes = nn::convert_to_integer(inst, qc);
  std::vector<float> logits = nn::run_logits(*inst.exec, inst.model, test, 0);
  const double acc = nn::accuracy_of(logits, test, inst.model.classes);
  // 3. The ONNX model, checked by ONNX before anything is written.
  onnx_export::Options opt;
  opt.graph_name = "qatgraph_" + o.model;
  opt.doc = "qatgraph " + t->config().spec().str() + ", " + qc.str() +
            ". int4/int2 weight codes are stored exactly as int8 (ONNX 1.12 has no 4-bit type).";
  opt.metadata = {{"qatgraph.model", t->config().spec().str()},
                  {"qatgraph.qconfig", qc.str()},
                  {"qatgraph.epoch", std::to_string(t->epoch())},
                  {"qatgraph.step", std::to_string(t->step())}};
  onnx_export::Result r =
      onnx_export::export_graph(*inst.graph, *inst.exec, inst.model.x, inst.model.logits, opt);
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  nn::write_file_atomic(e.onnx, r.bytes);
  if (!e.reference.empty()) write_reference(e.reference, test, logits, inst.model.classes);
  // 4. Summary.
  std::printf("qat export: %s, %s (epoch %d) -> %s\n", t->config().spec().str().c_str(),
              qc.str().c_str(), t->epoch(), e.onnx.c_str());
  std::string ops;
  for (const auto& [op, n] : r.op_counts)
    ops += (ops.empty() ? "" : ", ") + op + " " + std::to_string(n);
  std::printf(
      "ONNX opset %lld: %d nodes (%s), %d initializers, %lld bytes of initializers, "
      "file %zu bytes\n",
      static_cast<long long>(onnx_export::kOpset), r.nodes, ops.c_str(), r.initializers,
      static_cast<long long>(r.initializer_bytes), r.bytes.size());
  std::printf("converted graph (the reference): %lld model bytes, test accuracy %s on %lld rows\n",
              static_cast<long long>(bytes), pct(acc).c_str(), static_cast<long long>(test.size()));
  if (!e.reference.empty())
    std::printf("wrote %s/inputs.npy, labels.npy, logits.npy\n", e.reference.c_str());
#endif
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Export a `qat train` checkpoint as an ONNX QDQ model (integer weights)");
  auto e = std::make_shared<ExportOptions>();
  auto o = std::make_shared<TrainOptions>();
  auto l = std::make_shared<LlamaExportOptions>();
  cmd->add_option("checkpoint", e->checkpoint, "A checkpoint written by qat train")->required();
  cmd->add_option("--onnx", e->onnx, "Output .onnx file (written atomically)")->required();
  cmd->add_option("--reference", e->reference,
                  "Also write inputs.npy, labels.npy and logits.npy (the test split through the "
                  "converted integer-weight graph) into this directory");
  cmd->add_option("--data", o->data,
                  "digits.csv.gz (default: $QG_DIGITS_CSV, then python3-sklearn's copy); llama: "
                  "the token folder whose validation.tokens gives the prompts (default: random "
                  "ids)");
  add_model_options(cmd, *o);
  cmd->add_option("--config", l->config,
                  "llama: the model's config.json (default: config.json beside the checkpoint)");
  cmd->add_option("--prompts", l->prompts, "llama: prompts of the reference decode (the batch)")
      ->capture_default_str();
  cmd->add_option("--prompt-len", l->prompt_len, "llama: tokens per prompt")->capture_default_str();
  cmd->add_option("--new-tokens", l->new_tokens, "llama: greedy tokens decoded per prompt")
      ->capture_default_str();
  cmd->callback([e, o, l, cmd] {
    run_export(*e, *o, *l, [cmd](const char* option) { return cmd->count(option) > 0; });
  });
}

}  // namespace qg::cli
