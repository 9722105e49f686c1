#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace qg {
namespace {

class AlignedCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    QG_CHECK(p != nullptr, "cpu_allocator", "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};

struct DeviceSlot {
  Allocator* allocator = nullptr;
  CopyFn copy = nullptr;
};

DeviceSlot& cuda_slot() {
  static DeviceSlot slot;
  return slot;
}

// Per-thread overrides installed by ScopedAllocator, indexed cpu = 0, cuda = 1.
thread_local Allocator* tls_override[2] = {nullptr, nullptr};

int override_slot(DeviceType type) {
  return type == DeviceType::cpu ? 0 : 1;
}

}  // namespace

ScopedAllocator::ScopedAllocator(DeviceType type, Allocator* allocator)
    : type_(type), previous_(tls_override[override_slot(type)]) {
  tls_override[override_slot(type)] = allocator;
}

ScopedAllocator::~ScopedAllocator() {
  tls_override[override_slot(type_)] = previous_;
}

Allocator& cpu_allocator() {
  static AlignedCpuAllocator a;
  return a;
}

void install_device_allocator(DeviceType type, Allocator* allocator, CopyFn copy) {
  QG_CHECK(type == DeviceType::cuda, "allocator", "only a cuda allocator can be installed");
  cuda_slot() = DeviceSlot{allocator, copy};
}

Allocator& allocator_for(Device device) {
  if (Allocator* a = tls_override[override_slot(device.type)]) return *a;
  if (device.is_cpu()) return cpu_allocator();
  QG_CHECK(cuda_slot().allocator != nullptr, "allocator",
           "no CUDA backend is available for device ", device.str(),
           " (built without CUDA, or no GPU present)");
  return *cuda_slot().allocator;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  QG_CHECK(cuda_slot().copy != nullptr, "copy", "no CUDA backend is available to copy between ",
           src_device.str(), " and ", dst_device.str());
  cuda_slot().copy(dst, dst_device, src, src_device, bytes);
}

}  // namespace qg
