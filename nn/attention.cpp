// Multi-head self-attention (torch.nn.MultiheadAttention with batch_first, no masks, no
// dropout): x [N, T, D] -> q, k, v linears "<name>.q/.k/.v" [D, D] -> heads [N, H, T, D/H]
// -> softmax(q k^T / sqrt(D/H)) v -> merge heads -> output linear "<name>.out". The four
// projections carry the QConfig's weight and activation quantizers like any Linear; the
// score GEMMs and softmax stay in float (PyTorch's eager quantized MHA dequantizes there).
#include <cmath>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::attention(ValueId x, int64_t heads, const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() == 3, "nn.attention", "layer '", name, "' needs an [N, T, D] input, got ",
           g_.value(x).type.str());
  const int64_t n = xs[0], t = xs[1], d = xs[2];
  QG_CHECK(heads > 0 && d % heads == 0, "nn.attention", "layer '", name, "': heads = ", heads,
           " does not divide the model width D = ", d);
  const int64_t dh = d / heads;
  auto split = [&](ValueId v, const std::string& what) {
    ValueId r = g_.apply1("reshape", {v}, {{"shape", Shape{n, t, heads, dh}}},
                          name + "." + what + ".split");
    return g_.apply1("permute", {r}, {{"perm", Shape{0, 2, 1, 3}}}, name + "." + what + ".heads");
  };
  ValueId q = split(linear(x, d, name + ".q", false, true), "q");
  ValueId k = split(linear(x, d, name + ".k", false, true), "k");
  ValueId v = split(linear(x, d, name + ".v", false, true), "v");
  ValueId scores = g_.apply1("batched_matmul", {q, k}, {{"transpose_b", true}}, name + ".scores");
  ValueId scale = g_.constant(Tensor::scalar(1.0 / std::sqrt(static_cast<double>(dh)), DType::f32),
                              name + ".scale");
  scores = g_.apply1("mul", {scores, scale}, {}, name + ".scaled");
  ValueId p = g_.apply1("softmax", {scores}, {{"axis", -1}}, name + ".softmax");
  ValueId ctx = g_.apply1("batched_matmul", {p, v}, {}, name + ".context");
  ctx = g_.apply1("permute", {ctx}, {{"perm", Shape{0, 2, 1, 3}}}, name + ".merge");
  ctx = g_.apply1("reshape", {ctx}, {{"shape", Shape{n, t, d}}}, name + ".concat");
  ctx = act(ctx, name + ".context.out");
  return linear(ctx, d, name + ".out", false, true);
}

}  // namespace qg::nn
