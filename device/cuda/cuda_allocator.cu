#include "device/cuda/cuda_allocator.h"

#include "device/cuda/cuda_check.h"

namespace qg::cuda {

size_t CachingAllocator::round_size(size_t bytes) {
  // 512-byte granularity keeps every block 16-byte aligned for vectorised loads; large
  // blocks round to 2 MiB so near-equal sizes share cached blocks.
  const size_t small = 512, large = size_t{2} << 20;
  size_t g = bytes < large ? small : large;
  return (bytes + g - 1) / g * g;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  count_allocation(DeviceType::cuda);
  size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.lower_bound(size);
  void* p = nullptr;
  if (it != free_.end() && it->first == size) {
    p = it->second;
    free_.erase(it);
    cached_ -= size;
  } else {
    // cudaMalloc allocates on the current device: switch to this allocator's for the call
    // and back, so that the caller's kernels still launch where they did.
    int current = 0;
    QG_CUDA_CHECK("cuda_allocator", cudaGetDevice(&current));
    QG_CUDA_CHECK("cuda_allocator", cudaSetDevice(device_));
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !free_.empty()) {
      (void)cudaGetLastError();
      for (auto& [s, block] : free_) cudaFree(block);
      free_.clear();
      cached_ = 0;
      err = cudaMalloc(&p, size);
    }
    QG_CUDA_CHECK("cuda_allocator", cudaSetDevice(current));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      QG_FAIL("cuda_allocator", "cudaMalloc of ", bytes, " bytes on cuda:", device_,
              " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err), " (", in_use_,
              " bytes in use)");
    }
  }
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(size, ptr);
  in_use_ -= size;
  cached_ += size;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, block] : free_) cudaFree(block);
  free_.clear();
  cached_ = 0;
}

CachingAllocator::~CachingAllocator() {
  // Process teardown: the driver may already be shutting down, so errors are ignored.
  for (auto& [s, block] : free_) cudaFree(block);
}

CachingAllocator& allocator(int device) {
  // One per device index, made on first use and never destroyed (tensors held by static
  // objects may be freed during teardown, after any other static's destructor).
  static CachingAllocator* allocators[kMaxDevices] = {};
  static std::mutex mu;
  QG_CHECK(device >= 0 && device < kMaxDevices, "cuda_allocator", "device index ", device,
           " is outside [0, ", kMaxDevices, ")");
  std::lock_guard<std::mutex> lock(mu);
  if (allocators[device] == nullptr) allocators[device] = new CachingAllocator(device);
  return *allocators[device];
}

}  // namespace qg::cuda
