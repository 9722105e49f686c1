// Linear (torch.nn.Linear; under QAT torch.ao.nn.qat.Linear, and LinearReLU when fused):
// y = x W^T + b over the last axis of x, W fake-quantized by the QConfig's weight quantizer,
// the input by its GEMM-input quantizer, the output (after the fused ReLU) by its activation
// quantizer. Parameters "<name>.weight" [out, in] and "<name>.bias" [out] (none without bias).
#include <cmath>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::linear(ValueId x, int64_t out_features, const std::string& name, bool relu,
                        bool quantize_output, bool bias) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() >= 2, "nn.linear", "layer '", name, "' needs an input of rank >= 2, got ",
           g_.value(x).type.str());
  QG_CHECK(out_features > 0, "nn.linear", "layer '", name, "' needs out_features > 0, got ",
           out_features);
  LinearLayer l;
  l.name = name;
  l.in_features = xs.back();
  l.out_features = out_features;
  l.relu = relu;
  // PyTorch's nn.Linear default: kaiming_uniform(a = sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)),
  // and the bias uses the same bound.
  double bound = 1.0 / std::sqrt(static_cast<double>(l.in_features));
  l.weight = uniform_parameter(name + ".weight", {out_features, l.in_features}, bound);
  if (bias) l.bias = uniform_parameter(name + ".bias", {out_features}, bound);
  // Inputs of rank > 2 ([N, T, D] tokens) run as one [N * T, D] GEMM; linears reading the
  // same x may share this operand (nn/gemm_operand.cpp).
  ValueId xin = gemm_operand(x, name);
  ValueId w = weight(l.weight, name);
  l.weight_observer = weights_.empty() || qc_.weight == WeightQuant::none || qc_.dynamic_weights
                          ? -1
                          : weights_.back().observer;
  // The GEMM runs in the compute dtype (casts only under a mixed precision policy).
  const ValueId operand = xin;
  xin = gemm_operand_to_compute(x, xin, name);
  w = to_compute(w, name + ".weight");
  ValueId y = qc_.integer_forward
                  ? integer_matmul(operand, xin, w, name)
                  : g_.apply1("matmul", {xin, w}, {{"transpose_b", true}}, name + ".matmul");
  if (bias) y = g_.apply1("add", {y, to_compute(l.bias, name + ".bias")}, {}, name + ".add_bias");
  if (xs.size() > 2) {
    Shape ys = xs;
    ys.back() = out_features;
    y = g_.apply1("reshape", {y}, {{"shape", ys}}, name + ".unflatten");
  }
  if (relu) y = g_.apply1("relu", {y}, {}, name + ".relu");
  if (quantize_output) y = act(y, name + ".out", &l.output_observer);
  layers_.push_back(l);
  return y;
}

}  // namespace qg::nn
