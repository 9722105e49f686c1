// Conversion of a trained QAT MLP to real integer weights, and inference with them in plain
// C++ loops (no graph). nn/convert.h is the general path for every model kind (a pass over
// the model's graph); this one stays as an independent check of it for the MLP.
// Weights are stored as int8 codes, packed INT4 codes (two per byte, low nibble = even
// element, stored q + 8) or packed NF4 codes with one absmax per group; activations are
// quantized to uint8 codes between layers with the observers' frozen qparams. Each weight
// row is dequantized on the fly inside the matrix-vector loop, so the float weights are
// never materialised. The integer codes come from the same qparams the fake-quant graph
// used, so outputs match the fake-quant model up to float summation order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model.h"
#include "runtime/executor.h"

namespace qg::nn {

struct ActQParams {
  bool enabled = false;
  float scale = 1.0f;
  int32_t zero_point = 0;
};

struct QuantizedLinear {
  std::string name;
  int64_t in = 0, out = 0;
  WeightQuant kind = WeightQuant::none;
  std::vector<float> weight_f32;  // float weights (kind none)
  std::vector<int8_t> codes8;     // int8
  std::vector<uint8_t> packed;    // int4 / nf4, row-major, rows padded to whole bytes
  std::vector<float> scales;      // per channel (or one) for int8/int4; per group for nf4
  int64_t group_size = 0;         // nf4
  std::vector<float> bias;
  bool relu = false;
  ActQParams output;
};

class QuantizedMlp {
 public:
  ActQParams input;
  std::vector<QuantizedLinear> layers;

  // Bytes needed to store the model: weights (codes or f32), scales, biases (f32) and the
  // activation qparams (f32 scale + i32 zero point each).
  int64_t size_bytes() const;
  // Logits [n, classes] for `n` rows of x.
  std::vector<float> forward(const float* x, int64_t n) const;
};

// The (scale, zero_point) an observer node currently produces (eval mode: no update).
std::pair<std::vector<float>, std::vector<int32_t>> observer_qparams(Executor& ex, NodeId observer);

QuantizedMlp convert_to_quantized(Executor& ex, const std::vector<LinearLayer>& layers,
                                  NodeId input_observer, const QConfig& qconfig);
inline QuantizedMlp convert_to_quantized(Executor& ex, const Builder& b) {
  return convert_to_quantized(ex, b.layers(), b.input_observer(), b.qconfig());
}

// NF4 (SEMANTICS.md): the code of v = x / absmax is the number of midpoints between
// consecutive table values strictly below v.
uint8_t nf4_code(float v);
float nf4_value(uint8_t code);

}  // namespace qg::nn
