// Rotary position embedding of queries or keys [batch, heads, seq, head_dim] (transformers'
// LlamaRotaryEmbedding + apply_rotary_pos_emb): the rope op at the given i64 position ids
// [batch or 1, seq], or, without them, at positions 0..seq-1 shared by the batch (a constant
// "<name>.positions"). No parameters: the frequencies follow from rope_theta.
#include <vector>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::rotary(ValueId x, const std::string& name, double rope_theta,
                        ValueId position_ids) {
  const TensorType xt = g_.value(x).type;  // a copy: the positions constant grows the graph
  QG_CHECK(xt.shape.size() == 4, "nn.rotary", "layer '", name,
           "' needs [batch, heads, seq, head_dim], got ", xt.str());
  if (position_ids == kNoValue) {
    const int64_t seq = xt.shape[2];
    std::vector<int64_t> steps(static_cast<size_t>(seq));
    for (int64_t t = 0; t < seq; ++t) steps[static_cast<size_t>(t)] = t;
    position_ids = g_.constant(Tensor::from_vector<int64_t>({1, seq}, steps), name + ".positions");
  }
  return g_.apply1("rope", {x, position_ids}, {{"rope_theta", rope_theta}}, name);
}

}  // namespace qg::nn
