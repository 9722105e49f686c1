#include "runtime/backend.h"

#include "core/error.h"

namespace qg {

#ifdef QG_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int index);  // runtime/cuda/cuda_backend.cu
bool cuda_device_present();
#endif

namespace {
class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
};
}  // namespace

bool Backend::supports(const OpDef& op, DType dtype) const {
  return op.find_kernel(device().type, dtype) != nullptr;
}

const KernelDef& Backend::kernel_for(const OpDef& op, DType dtype) const {
  const KernelDef* k = op.find_kernel(device().type, dtype);
  QG_CHECK(k != nullptr, op.name, "no ", device_type_name(device().type), " kernel for dtype ",
           dtype_name(dtype));
  return *k;
}

bool cuda_available() {
#ifdef QG_WITH_CUDA
  return cuda_device_present();
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(Device device) {
  if (device.is_cpu()) return std::make_unique<CpuBackend>();
#ifdef QG_WITH_CUDA
  return make_cuda_backend(device.index);
#else
  QG_FAIL("backend", "device ", device.str(), " requested but qatgraph was built without CUDA");
#endif
}

}  // namespace qg
