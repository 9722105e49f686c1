// Pieces the tiny-Llama tests of this folder share: one fixed batch of token ids ([2, 7],
// vocabulary 50) with its next-token labels, and a count of an op's live nodes in a graph.
#pragma once

#include <string>

#include "core/graph.h"
#include "nn/llama.h"
#include "runtime/executor.h"

namespace qg::testing {

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
