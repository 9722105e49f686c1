// A caching device allocator: freed blocks are kept in size-class free lists and reused,
// so steady-state training steps do no cudaMalloc/cudaFree (which synchronise the device).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"

namespace qg::cuda {

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  ~CachingAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return Device::cuda(device_); }

  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes_in_use() const { return peak_; }
  size_t bytes_cached() const { return cached_; }
  void reset_peak() { peak_ = in_use_; }
  void release_cached();  // returns cached blocks to the driver

  static size_t round_size(size_t bytes);

 private:
  int device_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t in_use_ = 0, peak_ = 0, cached_ = 0;
};

// Device indices a process may use (one host has at most 16 GPUs).
inline constexpr int kMaxDevices = 16;

// The allocator of device `device` (made on first use).
CachingAllocator& allocator(int device = 0);

}  // namespace qg::cuda
