// `qat export` of a `qat train --model llama` checkpoint: the Llama decoder converted to
// integer weights (nn::convert_to_integer), exported as ONNX opset 21 with INT4 weights
// (export/onnx/), and, with --reference, the greedy decode of the converted model that
// scripts/onnx_llm_check.py repeats with onnxruntime.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace qg::cli {

struct LlamaExportOptions {
  std::string checkpoint, onnx, reference;
  std::string config;  // the model's config.json; empty: config.json beside the checkpoint
  std::string data;    // a token folder (validation.tokens) for the prompts; empty: random ids
  int64_t prompts = 16, prompt_len = 8, new_tokens = 64;
  uint64_t seed = 1;  // of the random prompts
};

// True for the meta section of an LmTrainer checkpoint ("config llama ...").
bool is_llama_checkpoint(const std::map<std::string, std::string>& meta);

void run_llama_export(const LlamaExportOptions& o, const std::map<std::string, std::string>& meta);

}  // namespace qg::cli
