// The middle of grouped-query causal self-attention, softmax(q k^T * scale + causal mask) v
// on q [N, H, T, hd] and k, v [N, KV, T, hd] (query head h reads KV head h / (H / KV)), in
// two forms that compute the same function:
//   fused     one causal_attention node (ops/attention): what the layer builds;
//   composed  repeat_kv, batched_matmul, scale, a constant [T, T] mask, softmax and
//             batched_matmul: the reference graph the fused op is tested against (its
//             scores and probabilities are [T, T] values of the input dtype).
// Both return the context [N, H, T, hd]; `name` prefixes the node names.
#pragma once

#include <string>

#include "core/graph.h"

namespace qg::nn {

ValueId fused_causal_attention(Graph& g, ValueId q, ValueId k, ValueId v, const std::string& name);
ValueId composed_causal_attention(Graph& g, ValueId q, ValueId k, ValueId v,
                                  const std::string& name);

}  // namespace qg::nn
