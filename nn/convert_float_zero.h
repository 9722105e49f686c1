// The integer form of a dynamic weight quantizer with a float zero point (int4 weight-only),
// used by the conversion pass (nn/convert.cpp); nn/convert_float_zero.cpp says how it stays
// bit for bit the fake-quantized weight.
#pragma once

#include <vector>

#include "core/graph.h"
#include "nn/builder.h"

namespace qg::nn {

// `fetched` holds the weight (f32 [out, in]) and its dynamic_fake_quantize's scale and zero
// ([out, groups], f32 holding the qparam dtype's values), as the model computes them in eval
// mode. Adds the packed codes and the nodes that rebuild the weight; returns that weight.
// Throws qg::Error (op "convert") for non-f32 weights, codes wider than 4 bits, and a
// non-finite weight, scale or zero.
ValueId float_zero_integer_weight(Graph& g, const WeightQuantizer& w,
                                  const std::vector<Tensor>& fetched);

}  // namespace qg::nn
