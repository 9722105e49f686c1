// Helpers of the Hugging Face Llama import tests: a llama model with its executor, and
// checkpoint folders written the way save_pretrained lays them out (config.json,
// model.safetensors or shards plus model.safetensors.index.json).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/npy.h"
#include "core/safetensors.h"
#include "nn/hf_llama_import.h"
#include "nn/llama.h"
#include "runtime/executor.h"

namespace qg::testing {

// A fresh, empty temporary folder for this process.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "qg_hf_import_" + std::to_string(::getpid()) + "_" + name;
  const std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd;
  return dir;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// config.json of `c` as transformers 4.x writes it (a top-level rope_theta).
inline std::string config_json(const nn::LlamaConfig& c) {
  std::ostringstream os;
  os.precision(17);
  os << "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
     << "\"hidden_act\": \"silu\", \"hidden_size\": " << c.hidden_size
     << ", \"intermediate_size\": " << c.intermediate_size
     << ", \"num_hidden_layers\": " << c.num_hidden_layers
     << ", \"num_attention_heads\": " << c.num_attention_heads
     << ", \"num_key_value_heads\": " << c.num_key_value_heads
     << ", \"vocab_size\": " << c.vocab_size
     << ", \"max_position_embeddings\": " << c.max_position_embeddings
     << ", \"rms_norm_eps\": " << c.rms_norm_eps << ", \"rope_theta\": " << c.rope_theta
     << ", \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false")
     << ", \"torch_dtype\": \"float32\"}";
  return os.str();
}

// A llama model of `config` for batch x seq ids, with its executor.
struct LlamaUnderTest {
  Graph g;
  nn::LlamaConfig config;
  nn::LlamaModel m;
  std::unique_ptr<Executor> ex;
  LlamaUnderTest(const nn::LlamaConfig& c, int64_t batch, int64_t seq, uint64_t seed = 1)
      : config(c) {
    m = nn::build_llama(g, c, batch, seq, nn::QConfig::float32(), seed);
    ex = std::make_unique<Executor>(g);
  }
  // Every parameter's value by name.
  std::map<std::string, Tensor> params() const {
    std::map<std::string, Tensor> out;
    for (ValueId p : m.parameters) out[g.value(p).name] = ex->parameter(g.value(p).name).clone();
    return out;
  }
  Tensor logits(const Tensor& ids) {
    return ex->run({{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}}, {m.logits})[0];
  }
};

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Writes `tensors` as a checkpoint folder: config.json and, for shards == 0,
// model.safetensors; else `shards` files model-0000k-of-0000n.safetensors (names dealt out
// in turn) and model.safetensors.index.json.
inline void write_checkpoint(const std::string& dir, const std::string& config,
                             const std::map<std::string, Tensor>& tensors, int shards = 0) {
  write_text(dir + "/config.json", config);
  if (shards == 0) {
    save_safetensors(dir + "/model.safetensors", tensors);
    return;
  }
  std::vector<std::map<std::string, Tensor>> parts(static_cast<size_t>(shards));
  std::ostringstream index;
  index << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
  int k = 0;
  for (const auto& [name, t] : tensors) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", k % shards + 1, shards);
    parts[static_cast<size_t>(k % shards)][name] = t;
    index << (k ? ", " : "") << "\"" << name << "\": \"" << file << "\"";
    ++k;
  }
  index << "}}";
  for (int s = 0; s < shards; ++s) {
    char file[64];
    std::snprintf(file, sizeof(file), "/model-%05d-of-%05d.safetensors", s + 1, shards);
    save_safetensors(dir + file, parts[static_cast<size_t>(s)]);
  }
  write_text(dir + "/model.safetensors.index.json", index.str());
}

// max |a - b| over all elements, and max |b|.
inline std::pair<double, double> max_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return {err, scale};
}

}  // namespace qg::testing
