#include "nn/model.h"

#include <sstream>

#include "core/error.h"

namespace qg::nn {
namespace {

ValueId mlp_body(Builder& b, ValueId x, const ModelSpec& spec) {
  ValueId h = x;
  for (size_t i = 0; i < spec.mlp.hidden.size(); ++i)
    h = b.linear(h, spec.mlp.hidden[i], "fc" + std::to_string(i + 1), true, true);
  return b.linear(h, spec.mlp.classes, "fc" + std::to_string(spec.mlp.hidden.size() + 1), false,
                  b.qconfig().static_activations());
}

ValueId cnn_body(Builder& b, ValueId x, const ModelSpec& spec) {
  const CnnSpec& c = spec.cnn;
  QG_CHECK(c.image > 0 && c.image * c.image == spec.mlp.in_features && c.channels.size() == 3,
           "nn.cnn", "a CNN needs in_features = image^2 (", spec.mlp.in_features, " vs image ",
           c.image, ") and three channel counts (got ", c.channels.size(), ")");
  Graph& g = b.graph();
  ValueId h =
      g.apply1("reshape", {x}, {{"shape", Shape{spec.mlp.batch, 1, c.image, c.image}}}, "image");
  auto block = [&](ValueId in, int64_t cin, int64_t cout, const std::string& name) {
    return b.conv_bn(in, cin, cout, 3, name, 1, 1);  // ConvBnReLU2d, folded for QAT
  };
  h = block(h, 1, c.channels[0], "conv1");
  h = block(h, c.channels[0], c.channels[1], "conv2");
  h = b.max_pool2d(h, 2, "pool");
  h = block(h, c.channels[1], c.channels[2], "conv3");
  h = b.global_avg_pool(h, "gap");
  return b.linear(h, spec.mlp.classes, "fc", false, b.qconfig().static_activations());
}

ValueId transformer_body(Builder& b, ValueId x, const ModelSpec& spec) {
  const TransformerSpec& t = spec.transformer;
  QG_CHECK(t.tokens > 0 && spec.mlp.in_features % t.tokens == 0 && t.layers > 0, "nn.transformer",
           "in_features ", spec.mlp.in_features, " must split into tokens = ", t.tokens,
           " equal tokens, with layers = ", t.layers, " > 0");
  Graph& g = b.graph();
  ValueId h = g.apply1(
      "reshape", {x}, {{"shape", Shape{spec.mlp.batch, t.tokens, spec.mlp.in_features / t.tokens}}},
      "tokens");
  h = b.token_embedding(h, t.d_model, t.max_positions, "embed");
  for (int64_t i = 0; i < t.layers; ++i)
    h = b.transformer_block(h, t.heads, t.mlp_hidden, "block" + std::to_string(i));
  h = b.layer_norm(h, "ln_f");
  h = g.apply1("mean", {h}, {{"axes", Shape{1}}}, "pool_tokens");
  return b.linear(h, spec.mlp.classes, "head", false, b.qconfig().static_activations());
}

}  // namespace

const std::vector<std::string>& model_kinds() {
  static const std::vector<std::string> kinds = {"mlp", "cnn", "transformer"};
  return kinds;
}

std::string ModelSpec::str() const {
  std::ostringstream os;
  os << kind << ' ';
  if (kind == "cnn") {
    os << "1x" << cnn.image << 'x' << cnn.image;
    for (size_t i = 0; i < cnn.channels.size(); ++i)
      os << '-' << cnn.channels[i] << (i == 1 ? "-pool" : "");
    os << "-gap-" << mlp.classes;
  } else if (kind == "transformer") {
    os << transformer.tokens << "x" << mlp.in_features / std::max<int64_t>(1, transformer.tokens)
       << " tokens, d " << transformer.d_model << ", " << transformer.heads << " heads, "
       << transformer.layers << " blocks, mlp " << transformer.mlp_hidden << ", " << mlp.classes
       << " classes";
  } else {
    os << mlp.in_features;
    for (int64_t h : mlp.hidden) os << '-' << h;
    os << '-' << mlp.classes;
  }
  return os.str();
}

Model build_model(Graph& graph, const ModelSpec& spec, const QConfig& qconfig, uint64_t seed) {
  const MlpSpec& s = spec.mlp;
  QG_CHECK(s.batch > 0 && s.in_features > 0 && s.classes > 1, "nn.model", "bad model spec: batch ",
           s.batch, ", in ", s.in_features, ", classes ", s.classes);
  QG_CHECK(spec.kind == "mlp" || spec.kind == "cnn" || spec.kind == "transformer", "nn.model",
           "unknown model kind '", spec.kind, "' (known: mlp, cnn, transformer)");
  Builder b(graph, qconfig, seed);
  Model m;
  m.batch = s.batch;
  m.classes = s.classes;
  m.x = graph.input("x", {DType::f32, {s.batch, s.in_features}});
  m.labels = graph.input("labels", {DType::i64, {s.batch}});
  ValueId h = b.quant_input(m.x);
  if (spec.kind == "mlp")
    m.logits = mlp_body(b, h, spec);
  else if (spec.kind == "cnn")
    m.logits = cnn_body(b, h, spec);
  else
    m.logits = transformer_body(b, h, spec);
  graph.set_name(m.logits, "logits");
  m.loss = b.cross_entropy(m.logits, m.labels);
  graph.set_name(m.loss, "loss");
  m.layers = b.layers();
  m.weights = b.weight_quantizers();
  m.conv_bns = b.conv_bn_layers();
  m.input_observer = b.input_observer();
  m.parameters = b.parameters();
  return m;
}

}  // namespace qg::nn
