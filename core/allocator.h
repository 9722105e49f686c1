// Allocators per device. The CPU allocator is 64-byte aligned (one cache line, and wide
// enough for AVX-512 loads) and keeps freed blocks for reuse up to a limit
// (core/caching_cpu_allocator.h: QG_CPU_CACHE_BYTES, statistics). The first CUDA device
// context (device/) installs the CUDA allocators and copy routine, so core never includes
// CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace qg {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

inline constexpr size_t kCpuAlignment = 64;

Allocator& cpu_allocator();

// While alive, routes this thread's allocations for one device type to `allocator` instead of
// the installed one (a StaticRun's scratch pool, so that kernels allocating temporaries get
// the same buffers on every launch and a CUDA-graph capture allocates nothing). Guards nest.
class ScopedAllocator {
 public:
  ScopedAllocator(DeviceType type, Allocator* allocator);
  ~ScopedAllocator();
  ScopedAllocator(const ScopedAllocator&) = delete;
  ScopedAllocator& operator=(const ScopedAllocator&) = delete;

 private:
  DeviceType type_;
  Allocator* previous_;
};

// Copies `bytes` between any two devices; installed with the allocator. It has no stream of
// its own to order against, so it waits for the device's queued work first.
using CopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                        size_t bytes);

// The allocator of one device index.
using DeviceAllocatorFn = Allocator& (*)(int index);

void install_device_allocator(DeviceType type, DeviceAllocatorFn allocator, CopyFn copy);
// Throws qg::Error when no backend for the device was built or none is present.
Allocator& allocator_for(Device device);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// How many allocation requests reached a device's installed allocator (the CPU's caching
// allocator, the CUDA caching allocator) since the process started; a cache hit counts too.
// Requests that a ScopedAllocator's pool serves do not. A compiled step in its steady state
// makes none (tests/runtime/compile_test.cpp checks it).
uint64_t allocation_count(DeviceType type);
// Called by the installed allocators on every request.
void count_allocation(DeviceType type);

}  // namespace qg
