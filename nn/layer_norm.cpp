// LayerNorm over the last axis (torch.nn.LayerNorm(D)): parameters "<name>.weight" (ones)
// and "<name>.bias" (zeros) [D]; the output gets the activation quantizer.
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::layer_norm(ValueId x, const std::string& name, double eps) {
  const Shape& xs = shape_of_value(g_, x);
  QG_CHECK(!xs.empty(), "nn.layer_norm", "layer '", name, "' needs rank >= 1, got ",
           g_.value(x).type.str());
  const int64_t d = xs.back();
  ValueId gamma = filled_parameter(name + ".weight", {d}, 1.0);
  ValueId beta = filled_parameter(name + ".bias", {d}, 0.0);
  ValueId y = g_.apply("layer_norm", {x, gamma, beta}, {{"eps", eps}}, name)[0];
  return act(y, name + ".out");
}

}  // namespace qg::nn
