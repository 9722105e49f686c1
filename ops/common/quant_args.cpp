#include "ops/common/quant_args.h"

#include "core/error.h"

namespace qg {

ParseArgsFn quant_scope_parser(size_t data_input) {
  return [data_input](const ArgsSource& s) -> std::shared_ptr<const KernelArgs> {
    QG_CHECK(data_input < s.inputs.size(), s.op, "has ", s.inputs.size(),
             " inputs; its scope is laid out over input ", data_input);
    auto args = std::make_shared<QuantScopeArgs>();
    // Ops without range attributes (dequantize, the backward ops) keep the default range.
    if (s.attrs.has("bits")) args->range = quant_range_from_attrs(s.op, s.attrs);
    args->layout = scope_layout(s.op, s.attrs, s.inputs[data_input].shape);
    return args;
  };
}

}  // namespace qg
