#include "device/device_context.h"

#include <cstdlib>
#include <cstring>

#include "core/allocator.h"
#include "core/error.h"

namespace qg {

#ifdef QG_WITH_CUDA
// device/cuda/cuda_context.cu
std::unique_ptr<DeviceContext> make_cuda_context(int index, const ContextOptions& options);
bool cuda_device_present();
#endif

namespace {

class CpuContext final : public DeviceContext {
 public:
  explicit CpuContext(PrecisionFlags precision)
      : DeviceContext(Device::cpu(), nullptr, nullptr, precision) {}
  ~CpuContext() override { release_library_handles(); }
};

}  // namespace

PrecisionFlags PrecisionFlags::from_environment() {
  PrecisionFlags flags;
  const char* env = std::getenv("QG_ALLOW_TF32");
  flags.allow_tf32 = env != nullptr && std::strcmp(env, "1") == 0;
  return flags;
}

DeviceContext::DeviceContext(Device device, void* stream, void* error_buffer,
                             PrecisionFlags precision)
    : device_(device), stream_(stream), error_buffer_(error_buffer), precision_(precision) {}

DeviceContext::~DeviceContext() = default;

void DeviceContext::release_library_handles() {
  for (Handle& h : handles_) {
    if (h.handle != nullptr && h.destroy != nullptr) h.destroy(h.handle);
    h = Handle{};
  }
}

void DeviceContext::copy(void* dst, Device dst_device, const void* src, Device src_device,
                         size_t bytes) {
  copy_bytes(dst, dst_device, src, src_device, bytes);
}

void* DeviceContext::library_handle(LibraryHandle which, CreateHandle create,
                                    DestroyHandle destroy) {
  Handle& h = handles_[static_cast<int>(which)];
  if (h.handle == nullptr) {
    h.handle = create(*this);
    h.destroy = destroy;
  }
  return h.handle;
}

bool cuda_available() {
#ifdef QG_WITH_CUDA
  return cuda_device_present();
#else
  return false;
#endif
}

std::unique_ptr<DeviceContext> make_device_context(Device device, const ContextOptions& options) {
  if (device.is_cpu()) {
    auto ctx = std::make_unique<CpuContext>(options.precision);
    ctx->set_communicator(options.communicator);
    ctx->set_sync_statistics(options.sync_statistics);
    ctx->set_sync_batch_norm(options.sync_batch_norm);
    return ctx;
  }
#ifdef QG_WITH_CUDA
  std::unique_ptr<DeviceContext> ctx = make_cuda_context(device.index, options);
  ctx->set_communicator(options.communicator);
  ctx->set_sync_statistics(options.sync_statistics);
  ctx->set_sync_batch_norm(options.sync_batch_norm);
  return ctx;
#else
  QG_FAIL("device_context", "device ", device.str(),
          " requested but qatgraph was built without CUDA");
#endif
}

}  // namespace qg
