#include "nn/model.h"

#include <cmath>

#include "core/error.h"
#include "core/op_registry.h"

namespace qg::nn {
namespace {

// The observer op for a QConfig. The moving-average observer is used when the registry has
// it; builds without it fall back to the running min/max observer.
std::string observer_op(const QConfig& qc, Attrs& attrs) {
  if (qc.observer == ObserverKind::moving_average &&
      OpRegistry::instance().find("moving_average_observer") != nullptr) {
    attrs.set("averaging_constant", qc.averaging_constant);
    return "moving_average_observer";
  }
  return "minmax_observer";
}

Tensor uniform_tensor(Rng& rng, const Shape& shape, double bound) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.uniform(-bound, bound));
  return t;
}

}  // namespace

Builder::Builder(Graph& graph, QConfig qconfig, uint64_t seed)
    : g_(graph), qc_(std::move(qconfig)), rng_(seed) {
  QG_CHECK(qc_.weight_scope == "channel" || qc_.weight_scope == "tensor", "nn", "weight scope '",
           qc_.weight_scope, "' is not one of channel, tensor");
}

ValueId Builder::fake_quant_activation(ValueId x, const std::string& name, NodeId* observer) {
  if (qc_.activation == ActQuant::none) return x;
  // quint8 0..255, per-tensor affine: PyTorch's default QAT activation fake-quant.
  Attrs obs_attrs{{"bits", 8}, {"signed", false}, {"qscheme", "affine"}};
  std::string op = observer_op(qc_, obs_attrs);
  auto qp = g_.apply(op, {x}, obs_attrs, name + ".observer");
  *observer = g_.value(qp[0]).producer;
  return g_.apply("fake_quantize", {x, qp[0], qp[1]}, {{"bits", 8}, {"signed", false}},
                  name + ".fq")[0];
}

ValueId Builder::fake_quant_weight(ValueId w, const std::string& name, NodeId* observer) {
  if (qc_.weight == WeightQuant::none) return w;
  if (qc_.weight == WeightQuant::nf4) {
    QG_CHECK(OpRegistry::instance().find("nf4_quantize_pack") != nullptr, "nn",
             "NF4 weights need the op 'nf4_quantize_pack', which this build does not register");
    // NF4 round trip per group of nf4_group_size weights along each row, then a
    // straight-through estimator built from existing ops:
    //   y = stop_gradient(wq) + (w - stop_gradient(w))
    // w - w is exactly 0 for finite w, so y == wq bit for bit, while dy/dw = 1.
    Attrs layout{{"group_size", static_cast<int64_t>(qc_.nf4_group_size)}, {"axis", -1}};
    auto packed = g_.apply("nf4_quantize_pack", {w}, layout, name + ".nf4_pack");
    Attrs unpack = layout;
    unpack.set("shape", g_.value(w).type.shape);
    ValueId wq = g_.apply1("nf4_unpack_dequantize", {packed[0], packed[1]}, unpack, name + ".fq");
    ValueId zero = g_.apply1("sub", {w, g_.apply1("stop_gradient", {w})}, {}, name + ".ste_zero");
    return g_.apply1("add", {g_.apply1("stop_gradient", {wq}), zero}, {}, name + ".ste");
  }
  // Symmetric signed, full range (-128..127 / -8..7), zero point 0, per output channel:
  // PyTorch's default_per_channel_weight_fake_quant for int8.
  int64_t bits = qc_.weight_bits();
  Attrs range{{"bits", bits}, {"signed", true}};
  Attrs scope{{"scope", qc_.weight_scope}, {"axis", 0}};
  Attrs obs_attrs = range;
  obs_attrs.set("qscheme", "symmetric");
  for (const auto& [k, v] : scope.items()) obs_attrs.set(k, v);
  std::string op = observer_op(qc_, obs_attrs);
  auto qp = g_.apply(op, {w}, obs_attrs, name + ".observer");
  *observer = g_.value(qp[0]).producer;
  Attrs fq_attrs = range;
  for (const auto& [k, v] : scope.items()) fq_attrs.set(k, v);
  return g_.apply("fake_quantize", {w, qp[0], qp[1]}, fq_attrs, name + ".fq")[0];
}

ValueId Builder::quant_input(ValueId x, const std::string& name) {
  return fake_quant_activation(x, name, &input_observer_);
}

ValueId Builder::linear(ValueId x, int64_t out_features, const std::string& name, bool relu,
                        bool quantize_output) {
  const TensorType& xt = g_.value(x).type;
  QG_CHECK(xt.shape.size() == 2, "nn.linear", "layer '", name, "' needs a 2-D input, got ",
           xt.str());
  QG_CHECK(out_features > 0, "nn.linear", "layer '", name, "' needs out_features > 0, got ",
           out_features);
  LinearLayer l;
  l.name = name;
  l.in_features = xt.shape[1];
  l.out_features = out_features;
  l.relu = relu;
  // PyTorch's nn.Linear default: kaiming_uniform(a = sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)),
  // and the bias uses the same bound.
  double bound = 1.0 / std::sqrt(static_cast<double>(l.in_features));
  l.weight =
      g_.parameter(name + ".weight", uniform_tensor(rng_, {out_features, l.in_features}, bound));
  l.bias = g_.parameter(name + ".bias", uniform_tensor(rng_, {out_features}, bound));
  ValueId w = fake_quant_weight(l.weight, name + ".weight", &l.weight_observer);
  ValueId y = g_.apply1("matmul", {x, w}, {{"transpose_b", true}}, name + ".matmul");
  y = g_.apply1("add", {y, l.bias}, {}, name + ".add_bias");
  if (relu) y = g_.apply1("relu", {y}, {}, name + ".relu");
  if (quantize_output) y = fake_quant_activation(y, name + ".out", &l.output_observer);
  layers_.push_back(l);
  return y;
}

ValueId Builder::cross_entropy(ValueId logits, ValueId labels) {
  return g_.apply1("softmax_cross_entropy", {logits, labels}, {{"reduction", "mean"}}, "loss");
}

std::vector<ValueId> Builder::parameters() const {
  std::vector<ValueId> p;
  for (const auto& l : layers_) {
    p.push_back(l.weight);
    p.push_back(l.bias);
  }
  return p;
}

Mlp build_mlp(Graph& graph, const MlpSpec& spec, const QConfig& qconfig, uint64_t seed) {
  QG_CHECK(spec.batch > 0 && spec.in_features > 0 && spec.classes > 1, "nn.mlp",
           "bad MLP spec: batch ", spec.batch, ", in ", spec.in_features, ", classes ",
           spec.classes);
  Builder b(graph, qconfig, seed);
  Mlp m;
  m.x = graph.input("x", {DType::f32, {spec.batch, spec.in_features}});
  m.labels = graph.input("labels", {DType::i64, {spec.batch}});
  ValueId h = b.quant_input(m.x);
  for (size_t i = 0; i < spec.hidden.size(); ++i)
    h = b.linear(h, spec.hidden[i], "fc" + std::to_string(i + 1), true, true);
  m.logits = b.linear(h, spec.classes, "fc" + std::to_string(spec.hidden.size() + 1), false,
                      qconfig.activation != ActQuant::none);
  graph.set_name(m.logits, "logits");
  m.loss = b.cross_entropy(m.logits, m.labels);
  graph.set_name(m.loss, "loss");
  m.layers = b.layers();
  m.input_observer = b.input_observer();
  m.parameters = b.parameters();
  return m;
}

}  // namespace qg::nn
