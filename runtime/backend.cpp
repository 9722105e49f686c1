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
