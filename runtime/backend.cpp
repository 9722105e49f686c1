#include "runtime/backend.h"

#include "core/error.h"

namespace qg {

Backend::Backend(std::unique_ptr<DeviceContext> context) : context_(std::move(context)) {}

bool Backend::supports(const OpDef& op, DType dtype) const {
  return op.find_kernel(device().type, dtype) != nullptr;
}

const KernelDef& Backend::kernel_for(const OpDef& op, DType dtype) const {
  const KernelDef* k = op.find_kernel(device().type, dtype);
  QG_CHECK(k != nullptr, op.name, "no ", device_type_name(device().type), " kernel for dtype ",
           dtype_name(dtype));
  return *k;
}

std::unique_ptr<Backend> make_backend(Device device, const ContextOptions& options) {
  return std::make_unique<Backend>(make_device_context(device, options));
}

}  // namespace qg
