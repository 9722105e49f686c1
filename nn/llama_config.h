// The sizes of a Llama-architecture decoder, read from a Hugging Face config.json
// (transformers' LlamaConfig). The five size fields are required; num_key_value_heads,
// rms_norm_eps, rope_theta, max_position_embeddings and tie_word_embeddings take LlamaConfig's
// defaults when absent (older checkpoints omit them); rope_theta may also come as
// transformers 5's "rope_parameters": {"rope_type": "default", "rope_theta": ...}. Features this
// decoder does not have (rope_scaling, attention or MLP biases, another hidden_act, a head_dim
// other than hidden_size / num_attention_heads) are rejected rather than silently ignored.
#pragma once

#include <cstdint>
#include <string>

namespace qg::nn {

struct LlamaConfig {
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0;
  int64_t vocab_size = 0, max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool tie_word_embeddings = false;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// Parses the text of a config.json; `what` names the source in errors. Throws qg::Error
// (op "nn.llama_config") naming the field for a missing required field, a field of the wrong
// JSON type, or a value out of range, and for text that is not a JSON object.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& what);
// The same from a file.
LlamaConfig load_llama_config(const std::string& path);

}  // namespace qg::nn
