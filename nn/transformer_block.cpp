// A pre-norm transformer encoder block (torch.nn.TransformerEncoderLayer with
// norm_first=True, activation="gelu", no dropout):
//   x = x + attn(ln1(x));   x = x + fc2(gelu(fc1(ln2(x))))
// Layers: "<name>.ln1", "<name>.attn", "<name>.ln2", "<name>.mlp.fc1", "<name>.mlp.fc2".
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::transformer_block(ValueId x, int64_t heads, int64_t mlp_hidden,
                                   const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() == 3 && mlp_hidden > 0, "nn.transformer_block", "layer '", name,
           "' needs an [N, T, D] input and mlp_hidden > 0, got ", g_.value(x).type.str(),
           " and mlp_hidden ", mlp_hidden);
  const int64_t d = xs[2];
  ValueId a = attention(layer_norm(x, name + ".ln1"), heads, name + ".attn");
  x = act(g_.apply1("add", {x, a}, {}, name + ".residual1"), name + ".residual1");
  ValueId h = linear(layer_norm(x, name + ".ln2"), mlp_hidden, name + ".mlp.fc1", false, false);
  h = g_.apply1("gelu", {h}, {{"approximate", "none"}}, name + ".mlp.gelu");
  h = act(h, name + ".mlp.fc1.out");
  h = linear(h, d, name + ".mlp.fc2", false, true);
  return act(g_.apply1("add", {x, h}, {}, name + ".residual2"), name + ".residual2");
}

}  // namespace qg::nn
