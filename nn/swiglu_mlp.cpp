// Llama's SwiGLU MLP (transformers' LlamaMLP): down_proj(silu(gate_proj(x)) * up_proj(x)),
// three Linears without bias: "<name>.gate_proj" and "<name>.up_proj" [I, D], "<name>.down_proj"
// [D, I]. Each takes its quantizers from the QConfig; the product silu(gate) * up is the
// down projection's input, so it gets the activation quantizer there (the gate and up
// outputs feed only element-wise work and stay unquantized, as the fc1 of the encoder block).
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::swiglu_mlp(ValueId x, int64_t intermediate, const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() >= 2 && intermediate > 0, "nn.swiglu_mlp", "layer '", name,
           "' needs an input of rank >= 2 and intermediate > 0, got ", g_.value(x).type.str(),
           " and intermediate ", intermediate);
  const int64_t d = xs.back();
  ValueId gate = linear(x, intermediate, name + ".gate_proj", false, false, /*bias=*/false);
  ValueId up = linear(x, intermediate, name + ".up_proj", false, false, /*bias=*/false);
  gate = g_.apply1("silu", {gate}, {}, name + ".act_fn");
  ValueId h = act(g_.apply1("mul", {gate, up}, {}, name + ".gated"), name + ".gated");
  return linear(h, d, name + ".down_proj", false, true, /*bias=*/false);
}

}  // namespace qg::nn
