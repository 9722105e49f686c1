// LayerNorm over the last axis (torch.nn.LayerNorm(D)): parameters "<name>.weight" (ones)
// and "<name>.bias" (zeros) [D]; the output gets the activation quantizer. Runs the
// layer_norm op; a build without it computes the same math from primitive ops
// (mean, sub, mul, add, sqrt, div; biased variance, as torch), differentiated by their rules.
#include "core/error.h"
#include "core/op_registry.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::layer_norm(ValueId x, const std::string& name, double eps) {
  const Shape& xs = shape_of_value(g_, x);
  QG_CHECK(!xs.empty(), "nn.layer_norm", "layer '", name, "' needs rank >= 1, got ",
           g_.value(x).type.str());
  const int64_t d = xs.back();
  ValueId gamma = filled_parameter(name + ".weight", {d}, 1.0);
  ValueId beta = filled_parameter(name + ".bias", {d}, 0.0);
  ValueId y = kNoValue;
  if (OpRegistry::instance().find("layer_norm") != nullptr) {
    y = g_.apply("layer_norm", {x, gamma, beta}, {{"eps", eps}}, name)[0];
  } else {
    Attrs last{{"axes", Shape{static_cast<int64_t>(xs.size()) - 1}}, {"keepdim", true}};
    ValueId mean = g_.apply1("mean", {x}, last, name + ".mean");
    ValueId centred = g_.apply1("sub", {x, mean}, {}, name + ".centred");
    ValueId var = g_.apply1("mean", {g_.apply1("mul", {centred, centred}, {}, name + ".square")},
                            last, name + ".var");
    ValueId eps_c = g_.constant(Tensor::scalar(eps, g_.value(x).type.dtype), name + ".eps");
    ValueId std = g_.apply1("sqrt", {g_.apply1("add", {var, eps_c}, {}, name + ".var_eps")}, {},
                            name + ".std");
    y = g_.apply1("div", {centred, std}, {}, name + ".normed");
    y = g_.apply1("add", {g_.apply1("mul", {y, gamma}, {}, name + ".scale"), beta}, {},
                  name + ".shift");
  }
  return act(y, name + ".out");
}

}  // namespace qg::nn
