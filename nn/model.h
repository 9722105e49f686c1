// Models built from the layer library (nn/builder.h) for the digits data: every model takes
// the graph input "x" [batch, 64] (8x8 pixels in [0, 1]) and "labels" [batch], and produces
// "logits" [batch, classes] and "loss". The batch is fixed at build time; building the same
// spec, QConfig and seed at another batch gives a graph whose stateful nodes have the same
// names, so trained state moves between them by name (nn/convert.h: copy_states).
//   mlp:         64 -> hidden... (LinearReLU) -> classes
//   cnn:         [N,1,8,8] -> conv_bn_relu(c1, 3x3, pad 1) -> conv_bn_relu(c2) -> max_pool 2
//                -> conv_bn_relu(c3) -> global_avg_pool -> linear(classes)
//   transformer: 8 tokens of 8 pixels -> linear embedding to d + positional table ->
//                `layers` pre-norm blocks -> final LN -> mean over tokens -> linear(classes)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/builder.h"

namespace qg::nn {

struct MlpSpec {
  int64_t in_features = 64;
  std::vector<int64_t> hidden = {128, 128};
  int64_t classes = 10;
  int64_t batch = 64;
};

struct CnnSpec {
  int64_t image = 8;  // square images of in_features = image * image pixels, one channel
  std::vector<int64_t> channels = {16, 32, 32};
};

struct TransformerSpec {
  int64_t tokens = 8;  // in_features = tokens * token_features
  int64_t d_model = 32, heads = 4, layers = 1, mlp_hidden = 64;
  int64_t max_positions = 8;
};

// Which model and its sizes; in_features, classes and batch come from `mlp`.
struct ModelSpec {
  std::string kind = "mlp";  // mlp, cnn, transformer
  MlpSpec mlp;
  CnnSpec cnn;
  TransformerSpec transformer;
  std::string str() const;  // e.g. "cnn 1x8x8-16-32-pool-32-gap-10"
};

struct Model {
  ValueId x = kNoValue, labels = kNoValue, logits = kNoValue, loss = kNoValue;
  int64_t batch = 0, classes = 0;
  std::vector<LinearLayer> layers;  // every Linear (QuantizedMlp reads the MLP's)
  std::vector<WeightQuantizer> weights;
  std::vector<ConvBnLayer> conv_bns;
  NodeId input_observer = -1;
  std::vector<ValueId> parameters;  // trainable; buffers excluded
};

// Throws qg::Error (op "nn.model") for an unknown kind.
Model build_model(Graph& graph, const ModelSpec& spec, const QConfig& qconfig, uint64_t seed);
// The model kinds build_model knows.
const std::vector<std::string>& model_kinds();

}  // namespace qg::nn
