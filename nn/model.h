// A small model-building API on top of core::Graph: linear layers whose parameters are graph
// parameters initialised from a seeded RNG, activations, a loss, and QConfig-driven
// observer -> fake_quantize chains as graph nodes (the QAT layout PyTorch's prepare_qat
// produces: a QuantStub on the input, weight fake-quant inside each Linear, activation
// fake-quant on each layer's output after its fused ReLU).
//
//   Graph g;
//   nn::Builder b(g, nn::QConfig::w8a8(), /*seed=*/1);
//   ValueId x = g.input("x", {DType::f32, {64, 64}});
//   ValueId h = b.relu(b.linear(b.quant_input(x), 128, "fc1"), /*quantize=*/true);
//   ValueId logits = b.linear(h, 10, "fc2", /*quantize_output=*/true);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph.h"
#include "nn/qconfig.h"
#include "nn/rng.h"

namespace qg::nn {

// What conversion to integer weights and checkpoints need to know about one Linear.
struct LinearLayer {
  std::string name;
  int64_t in_features = 0, out_features = 0;
  ValueId weight = kNoValue, bias = kNoValue;  // parameters: [out, in] and [out]
  NodeId weight_observer = -1;                 // -1 for float or NF4 weights
  NodeId output_observer = -1;                 // activation observer after this layer
  bool relu = false;
};

class Builder {
 public:
  Builder(Graph& graph, QConfig qconfig, uint64_t seed);

  // Activation fake-quant of a graph input (PyTorch's QuantStub under QAT).
  ValueId quant_input(ValueId x, const std::string& name = "input");
  // y = x W^T + b with W fake-quantized per the QConfig. With `relu` the ReLU is fused
  // (LinearReLU) before the output activation fake-quant; with `quantize_output` the
  // output gets an activation fake-quant.
  ValueId linear(ValueId x, int64_t out_features, const std::string& name, bool relu,
                 bool quantize_output);
  ValueId cross_entropy(ValueId logits, ValueId labels);

  // Observer -> fake_quantize on x (activation or weight per `weight`); returns the
  // fake-quantized value and, through `observer`, the observer node.
  ValueId fake_quant_activation(ValueId x, const std::string& name, NodeId* observer);
  ValueId fake_quant_weight(ValueId w, const std::string& name, NodeId* observer);

  Graph& graph() { return g_; }
  const QConfig& qconfig() const { return qc_; }
  const std::vector<LinearLayer>& layers() const { return layers_; }
  std::vector<ValueId> parameters() const;
  NodeId input_observer() const { return input_observer_; }

 private:
  Graph& g_;
  QConfig qc_;
  Rng rng_;
  std::vector<LinearLayer> layers_;
  NodeId input_observer_ = -1;
};

// The digits MLP: in -> hidden... (LinearReLU) -> classes, batch fixed at build time.
struct MlpSpec {
  int64_t in_features = 64;
  std::vector<int64_t> hidden = {128, 128};
  int64_t classes = 10;
  int64_t batch = 64;
};

struct Mlp {
  ValueId x = kNoValue, labels = kNoValue, logits = kNoValue, loss = kNoValue;
  std::vector<LinearLayer> layers;
  NodeId input_observer = -1;
  std::vector<ValueId> parameters;
};

Mlp build_mlp(Graph& graph, const MlpSpec& spec, const QConfig& qconfig, uint64_t seed);

}  // namespace qg::nn
