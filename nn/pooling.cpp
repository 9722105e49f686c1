// Pooling helpers (torch.nn.MaxPool2d, AdaptiveAvgPool2d(1) + flatten). No parameters; the
// output keeps the input's quantization (max and mean of fake-quantized values need no
// quantizer of their own, as in PyTorch's quantized pooling).
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::max_pool2d(ValueId x, int64_t kernel, const std::string& name) {
  QG_CHECK(shape_of_value(g_, x).size() == 4 && kernel > 0, "nn.max_pool2d", "layer '", name,
           "' needs an [N, C, H, W] input and kernel > 0, got ", g_.value(x).type.str(),
           " and kernel ", kernel);
  return g_.apply("max_pool2d", {x},
                  {{"kernel", Shape{kernel, kernel}}, {"stride", Shape{kernel, kernel}}}, name)[0];
}

ValueId Builder::global_avg_pool(ValueId x, const std::string& name) {
  QG_CHECK(shape_of_value(g_, x).size() == 4, "nn.global_avg_pool", "layer '", name,
           "' needs an [N, C, H, W] input, got ", g_.value(x).type.str());
  return g_.apply1("global_avg_pool2d", {x}, {}, name);
}

}  // namespace qg::nn
