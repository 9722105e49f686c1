#include "core/allocator.h"

#include <atomic>
#include <cstring>

#include "core/caching_cpu_allocator.h"
#include "core/error.h"

namespace qg {
namespace {

// The process's CPU allocator. Never destroyed: a tensor held by a static object may be freed
// after any other static's destructor has run. At exit its cache is emptied and switched off
// instead (ReleaseAtExit), so that no cached block outlives the process's teardown and blocks
// freed later go straight back to the system.
CachingCpuAllocator& process_cpu_allocator() {
  static CachingCpuAllocator* allocator = new CachingCpuAllocator(default_cpu_cache_limit());
  static struct ReleaseAtExit {
    ~ReleaseAtExit() { allocator->set_limit(0); }
  } release_at_exit;
  return *allocator;
}

struct DeviceSlot {
  DeviceAllocatorFn allocator = nullptr;
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

std::atomic<uint64_t> allocation_counts[2] = {0, 0};

}  // namespace

ScopedAllocator::ScopedAllocator(DeviceType type, Allocator* allocator)
    : type_(type), previous_(tls_override[override_slot(type)]) {
  tls_override[override_slot(type)] = allocator;
}

ScopedAllocator::~ScopedAllocator() {
  tls_override[override_slot(type_)] = previous_;
}

Allocator& cpu_allocator() {
  return process_cpu_allocator();
}

CpuCacheStats cpu_cache_stats() {
  return process_cpu_allocator().stats();
}

void set_cpu_cache_limit(size_t bytes) {
  process_cpu_allocator().set_limit(bytes);
}

void release_cpu_cache() {
  process_cpu_allocator().release_cached();
}

void install_device_allocator(DeviceType type, DeviceAllocatorFn allocator, CopyFn copy) {
  QG_CHECK(type == DeviceType::cuda, "allocator", "only a cuda allocator can be installed");
  cuda_slot() = DeviceSlot{allocator, copy};
}

Allocator& allocator_for(Device device) {
  if (Allocator* a = tls_override[override_slot(device.type)]) return *a;
  if (device.is_cpu()) return cpu_allocator();
  QG_CHECK(cuda_slot().allocator != nullptr, "allocator",
           "no CUDA allocator is installed for device ", device.str(),
           ": built without CUDA, or no GPU is present (with one, cuda_available(), a "
           "DeviceContext or an Executor on the device installs it)");
  return cuda_slot().allocator(device.index);
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

namespace qg {

uint64_t allocation_count(DeviceType type) {
  return allocation_counts[override_slot(type)].load(std::memory_order_relaxed);
}

void count_allocation(DeviceType type) {
  allocation_counts[override_slot(type)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace qg
