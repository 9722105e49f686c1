#include "core/kernel_args.h"

#include "core/error.h"
#include "core/op_schema.h"

namespace qg {

std::shared_ptr<const PreparedArgs> prepare_args(const OpDef& op, const Attrs& attrs,
                                                 const std::vector<TensorType>& inputs,
                                                 std::vector<KernelPart> parts) {
  auto prepared = std::make_shared<PreparedArgs>();
  prepared->parts = std::move(parts);
  if (op.parse_args)
    prepared->parsed = op.parse_args(ArgsSource{op.name, attrs, inputs, prepared->parts});
  return prepared;
}

const KernelPart& KernelContext::part(size_t i) const {
  QG_CHECK(i < prepared.parts.size(), op, "fused kernel asked for part ", i, " of ",
           prepared.parts.size(), " (the node it runs was not made by its fusion rule)");
  return prepared.parts[i];
}

}  // namespace qg
