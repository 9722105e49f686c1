// Token embedding for continuous tokens (a ViT-style patch embedding): x [N, T, F] -> a
// linear projection "<name>.proj" to D, plus a learned positional table
// "<name>.pos.weight" [max_positions, D] read through the embedding op at positions
// 0..T-1 (torch.nn.Embedding), then the activation quantizer.
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::token_embedding(ValueId x, int64_t d_model, int64_t max_positions,
                                 const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() == 3, "nn.embedding", "layer '", name, "' needs [N, T, F] tokens, got ",
           g_.value(x).type.str());
  QG_CHECK(d_model > 0 && max_positions > 0, "nn.embedding", "layer '", name, "': d_model ",
           d_model, " and max_positions ", max_positions, " must be positive");
  const int64_t t = xs[1];
  QG_CHECK(t <= max_positions, "nn.embedding", "layer '", name, "': sequence length ", t,
           " exceeds the positional table's ", max_positions, " rows");
  ValueId tokens = linear(x, d_model, name + ".proj", false, false);
  // Small positional init (ViT uses trunc_normal(0.02)); uniform with the same scale.
  ValueId table = uniform_parameter(name + ".pos.weight", {max_positions, d_model}, 0.02);
  std::vector<int64_t> positions(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions[static_cast<size_t>(i)] = i;
  ValueId idx = g_.constant(Tensor::from_vector<int64_t>({t}, positions), name + ".positions");
  ValueId pos = g_.apply1("embedding", {table, idx}, {}, name + ".pos");
  return act(g_.apply1("add", {tokens, pos}, {}, name + ".add_pos"), name + ".out");
}

}  // namespace qg::nn
