// RMSNorm over the last axis (transformers' LlamaRMSNorm(D, eps)): parameter "<name>.weight"
// [D] (ones), the rms_norm op, then the activation quantizer. The weight is a parameter of
// the policy's parameter dtype; where x comes in another dtype (bf16 activations, f32 master
// weights) the layer reads a cast of it, as a bf16 model's norm multiplies by a bf16 weight.
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::rms_norm(ValueId x, const std::string& name, double eps) {
  const TensorType xt = g_.value(x).type;  // a copy: adding the weight grows the graph
  QG_CHECK(!xt.shape.empty() && xt.shape.back() > 0, "nn.rms_norm", "layer '", name,
           "' normalises over the last axis, which x ", xt.str(), " lacks or is empty");
  ValueId weight = filled_parameter(name + ".weight", {xt.shape.back()}, 1.0);
  if (g_.value(weight).type.dtype != xt.dtype)
    weight = g_.apply1("cast", {weight}, {{"dtype", dtype_name(xt.dtype)}}, name + ".weight.cast");
  ValueId y = g_.apply("rms_norm", {x, weight}, {{"eps", eps}}, name)[0];
  return act(y, name + ".out");
}

}  // namespace qg::nn
