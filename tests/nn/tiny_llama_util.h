// Pieces the tiny-Llama tests share: the tiny decoder's config, one fixed batch of token ids
// ([2, 7], vocabulary 50) with its next-token labels, and a count of an op's live nodes in a
// graph.
#pragma once

#include <string>

#include "core/graph.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "runtime/executor.h"

namespace qg::testing {

// The decoder those ids feed: hidden 64, 4 heads (2 KV heads), vocabulary 50, 16 positions.
inline nn::LlamaConfig tiny_llama_config(int layers = 2) {
  nn::LlamaConfig c = nn::parse_llama_config(
      R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
          "max_position_embeddings": 16, "tie_word_embeddings": false})",
      "tiny");
  c.num_hidden_layers = layers;
  return c;
}

inline Executor::Feeds tiny_llama_feeds() {
  Tensor ids =
      Tensor::from_vector<int64_t>({2, 7}, {3, 17, 42, 0, 49, 8, 8, 25, 1, 33, 12, 40, 7, 19});
  return {{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}};
}

inline int count_live_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id)
    n += !g.node(id).dead && g.node(id).op->name == op;
  return n;
}

}  // namespace qg::testing
