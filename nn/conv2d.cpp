// Conv2d (torch.nn.Conv2d; under QAT torch.ao.nn.qat.Conv2d, ConvReLU2d when fused): x
// [N, C, H, W] -> [N, O, H', W'] with a square kernel, weight "<name>.weight" [O, C, k, k]
// fake-quantized per the QConfig (per output channel / group over C * k * k), bias
// "<name>.bias" [O], optional ReLU, then the output activation quantizer.
#include <cmath>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

void check_conv_input(const Graph& g, ValueId x, int64_t in_channels, const std::string& op,
                      const std::string& layer) {
  const TensorType& t = g.value(x).type;
  QG_CHECK(t.shape.size() == 4, op, "layer '", layer, "' needs an [N, C, H, W] input, got ",
           t.str());
  QG_CHECK(t.shape[1] == in_channels, op, "layer '", layer, "' expects ", in_channels,
           " input channels, but its input ", t.str(), " has ", t.shape[1]);
}

ValueId Builder::conv2d(ValueId x, int64_t in_channels, int64_t out_channels, int64_t kernel,
                        const std::string& name, int64_t stride, int64_t padding, bool relu,
                        bool quantize_output) {
  check_conv_input(g_, x, in_channels, "nn.conv2d", name);
  QG_CHECK(out_channels > 0 && kernel > 0 && stride > 0 && padding >= 0, "nn.conv2d", "layer '",
           name, "': out_channels ", out_channels, ", kernel ", kernel, ", stride ", stride,
           ", padding ", padding, " must be positive (padding >= 0)");
  // PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * kernel * kernel));
  ValueId w =
      uniform_parameter(name + ".weight", {out_channels, in_channels, kernel, kernel}, bound);
  ValueId b = uniform_parameter(name + ".bias", {out_channels}, bound);
  ValueId xin = gemm_input(x, name + ".in");
  ValueId y = g_.apply1("conv2d", {xin, weight(w, name), b},
                        {{"stride", Shape{stride, stride}}, {"padding", Shape{padding, padding}}},
                        name + ".conv");
  if (relu) y = g_.apply1("relu", {y}, {}, name + ".relu");
  if (quantize_output) y = act(y, name + ".out");
  return y;
}

}  // namespace qg::nn
