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

std::shared_ptr<const KernelArgs> no_kernel_args(const ArgsSource&) {
  static const auto empty = std::make_shared<const KernelArgs>();
  return empty;
}

const Attrs& no_raw_attrs() {
  static const Attrs empty;
  return empty;
}

void fail_part_args(const KernelPart& part) {
  QG_FAIL(part.op != nullptr ? part.op->name : std::string("fused part"),
          "fused kernel asked for arguments its part's parser did not produce");
}

const KernelPart& KernelContext::part(size_t i) const {
  QG_CHECK(i < prepared.parts.size(), op, "fused kernel asked for part ", i, " of ",
           prepared.parts.size(), " (the node it runs was not made by its fusion rule)");
  return prepared.parts[i];
}

}  // namespace qg
