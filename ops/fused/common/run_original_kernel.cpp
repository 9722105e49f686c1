#include "ops/fused/common/run_original_kernel.h"

#include "core/error.h"

namespace qg {

std::vector<Tensor> run_original_kernel(const std::string& fused_op, const KernelPart& original,
                                        DeviceType device, DType dtype, std::vector<Tensor> inputs,
                                        std::vector<Tensor> outputs, std::vector<Tensor>& states,
                                        const KernelContext& fused) {
  const KernelDef* k = original.op->find_kernel(device, dtypes_of(inputs));
  QG_CHECK(k != nullptr, fused_op, "no ", device_type_name(device), " kernel for ",
           original.op->name, " on ", dtype_name(dtype));
  KernelContext c(original.op->name, *original.prepared, original.attrs, std::move(inputs),
                  std::move(outputs), states, fused.device, fused.training);
  c.site = fused.site;  // failures inside name the fused node
  c.site_name = fused.site_name;
  k->fn(c);
  return c.outputs;
}

}  // namespace qg
