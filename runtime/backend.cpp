#include "runtime/backend.h"

#include "core/error.h"

namespace qg {

Backend::Backend(std::unique_ptr<DeviceContext> context) : context_(std::move(context)) {}

bool Backend::supports(const OpDef& op, const std::vector<DType>& input_dtypes) const {
  return op.find_kernel(device().type, input_dtypes) != nullptr;
}

const KernelDef& Backend::kernel_for(const OpDef& op,
                                     const std::vector<DType>& input_dtypes) const {
  const KernelDef* k = op.find_kernel(device().type, input_dtypes);
  if (k == nullptr) {
    std::string accepted;
    for (const KernelDef& other : op.kernels)
      if (other.device == device().type)
        accepted += (accepted.empty() ? "" : " or ") + other.dtypes.str(op.inputs);
    QG_FAIL(op.name, "no ", device_type_name(device().type), " kernel for inputs ",
            signature_str(input_dtypes, op.inputs), "; its ", device_type_name(device().type),
            " kernels accept ", accepted.empty() ? "nothing (none is registered)" : accepted);
  }
  return *k;
}

std::unique_ptr<Backend> make_backend(Device device, const ContextOptions& options) {
  return std::make_unique<Backend>(make_device_context(device, options));
}

}  // namespace qg
