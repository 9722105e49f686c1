// `qat llama-logits DIR`: imports a Hugging Face Llama checkpoint folder (config.json and
// safetensors weights, one file or sharded: nn/hf_llama_import.h) into the llama model and
// prints the logits of a token sequence, so a checkpoint can be checked against
// transformers by hand or in a script:
//   qat llama-logits DIR --tokens 1,17,42 [--out logits.npy] [--compare reference.npy]
//   qat llama-logits DIR --ids input_ids.npy ...   (i64 [batch, seq] or [seq])
// --config uses another config.json for the model (it must equal the folder's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "apps/qat/commands.h"
#include "core/error.h"
#include "core/npy.h"
#include "nn/hf_llama_import.h"
#include "nn/llama.h"
#include "runtime/executor.h"

namespace qg::cli {
namespace {

constexpr const char* kOp = "llama-logits";

struct LlamaLogitsArgs {
  std::string dir, config, tokens, ids, out, compare, device = "cpu";
};

Tensor parse_tokens(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    QG_CHECK(used > 0 && used == item.size(), kOp, "--tokens '", text, "': '", item,
             "' is not an integer token id");
    ids.push_back(v);
  }
  QG_CHECK(!ids.empty(), kOp, "--tokens is empty");
  return Tensor::from_vector<int64_t>({1, static_cast<int64_t>(ids.size())}, ids);
}

Tensor read_ids(const LlamaLogitsArgs& a, int64_t vocab) {
  QG_CHECK(a.tokens.empty() != a.ids.empty(), kOp, "give exactly one of --tokens and --ids");
  Tensor ids = a.ids.empty() ? parse_tokens(a.tokens) : load_npy(a.ids);
  if (ids.dim() == 1) ids = ids.reshape({1, ids.size(0)});
  QG_CHECK(ids.dtype() == DType::i64 && ids.dim() == 2, kOp, "--ids '", a.ids,
           "' must hold i64 [batch, seq] or [seq], got ", ids.str());
  const int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    QG_CHECK(p[i] >= 0 && p[i] < vocab, kOp, "token id ", p[i], " at position ", i,
             " is outside the vocabulary [0, ", vocab, ")");
  return ids;
}

void run_llama_logits(const LlamaLogitsArgs& a) {
  QG_CHECK(a.device == "cpu" || a.device == "cuda", kOp, "--device must be cpu or cuda, got '",
           a.device, "'");
  const nn::LlamaConfig config =
      a.config.empty() ? nn::load_hf_llama_config(a.dir) : nn::load_llama_config(a.config);
  const Tensor ids = read_ids(a, config.vocab_size);
  Graph g;
  nn::LlamaModel m =
      nn::build_llama(g, config, ids.size(0), ids.size(1), nn::QConfig::float32(), /*seed=*/0);
  Executor exec(g, a.device == "cuda" ? Device::cuda(0) : Device::cpu());
  const nn::ImportReport report = nn::import_hf_llama(exec, config, a.dir);
  std::printf("%s\n", report.summary().c_str());
  auto out =
      exec.run({{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}}, {m.logits, m.loss});
  const Tensor logits = out[0].to(Device::cpu());
  std::printf("logits %s, next-token loss %.6f\n", logits.str().c_str(),
              out[1].to(Device::cpu()).to_doubles()[0]);
  if (!a.out.empty()) save_npy(a.out, logits);
  if (!a.compare.empty()) {
    const Tensor ref = load_npy(a.compare);
    QG_CHECK(ref.shape() == logits.shape(), kOp, "--compare '", a.compare, "' holds ", ref.str(),
             ", the logits are ", logits.str());
    const std::vector<double> got = logits.to_doubles(), want = ref.to_doubles();
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    std::printf("max |logits - reference| = %.3g (max |reference| = %.3g)\n", err, scale);
  }
}

}  // namespace

void add_llama_logits_command(CLI::App& app) {
  auto a = std::make_shared<LlamaLogitsArgs>();
  auto* cmd = app.add_subcommand(
      "llama-logits", "Import a Hugging Face Llama checkpoint folder and print its logits");
  cmd->add_option("dir", a->dir, "Checkpoint folder: config.json and safetensors weights")
      ->required();
  cmd->add_option("--config", a->config, "The model's config.json (default: DIR/config.json)");
  cmd->add_option("--tokens", a->tokens, "Comma-separated token ids, one sequence");
  cmd->add_option("--ids", a->ids, ".npy of i64 token ids [batch, seq] or [seq]");
  cmd->add_option("--out", a->out, "Write the f32 logits [batch, seq, vocab] to this .npy");
  cmd->add_option("--compare", a->compare, "Print the largest difference from this .npy");
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->callback([a] { run_llama_logits(*a); });
}

}  // namespace qg::cli
