// A CPU allocator that keeps freed blocks and hands them out again.
//
// Why: glibc serves large requests (above its mmap threshold, at most 32 MiB) with a fresh
// mmap and unmaps them on free, so every Executor::run, which allocates each node's outputs
// anew, touched fresh pages: one minor page fault per 4 KiB written, about 65,500 per
// fake-quant forward + backward at f32[8192, 4096]. Kept blocks stay mapped, so a repeated
// run writes into pages it already owns.
//
// How: a freed block of at least kMinCachedBytes goes into the bucket of its size class
// (a request rounded up to within 1/8 of itself, so near-equal sizes share blocks); an
// allocation of that class takes the most recently freed one (its bytes are likeliest to be
// in cache). The cached bytes never exceed the limit: to keep a block, the blocks freed
// longest ago are returned to the system first, and a block larger than the limit is
// returned at once. Limit 0 disables the cache (every block goes straight back). Smaller
// blocks always go straight to malloc, whose own bins reuse them without a system call.
//
// A cached block holds whatever its last user wrote: like malloc's, allocations are
// uninitialised (Tensor::zeros clears its bytes itself). All members are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/allocator.h"

namespace qg {

struct CpuCacheStats {
  size_t limit_bytes = 0;
  size_t cached_bytes = 0;  // freed bytes held for reuse now (size-class rounded)
  size_t cached_blocks = 0;
  uint64_t hits = 0;       // allocations served from the cache
  uint64_t misses = 0;     // cacheable allocations that went to the system
  uint64_t evictions = 0;  // blocks returned to the system to stay under the limit
};

class CachingCpuAllocator final : public Allocator {
 public:
  static constexpr size_t kMinCachedBytes = size_t{64} << 10;

  explicit CachingCpuAllocator(size_t limit_bytes);
  ~CachingCpuAllocator() override;  // returns every cached block
  CachingCpuAllocator(const CachingCpuAllocator&) = delete;
  CachingCpuAllocator& operator=(const CachingCpuAllocator&) = delete;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  Device device() const override { return Device::cpu(); }

  // A new limit; cached blocks beyond it are returned to the system (0 empties the cache).
  void set_limit(size_t bytes);
  // Returns every cached block to the system; the limit stays.
  void release_cached();
  CpuCacheStats stats() const;

  // The bytes a request occupies: a multiple of kCpuAlignment, and for cached sizes the
  // size class (at most 1/8 above the request).
  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* ptr;
    size_t bytes;
  };
  using Lru = std::list<Block>;

  // Under mu_: moves the block freed longest ago from the cache to `evicted`, which the
  // caller frees after unlocking.
  void evict_oldest_locked(Lru& evicted);
  static void free_blocks(const Lru& blocks);

  mutable std::mutex mu_;
  size_t limit_;
  size_t cached_bytes_ = 0;
  Lru lru_;  // front: most recently freed
  // Per size class, its blocks in the order they were freed (the oldest in front), so the
  // oldest block of all is always the front of its bucket.
  std::unordered_map<size_t, std::deque<Lru::iterator>> buckets_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

// The limit of the process's CPU allocator when it is created: QG_CPU_CACHE_BYTES when set (a
// byte count with an optional K, M or G suffix, powers of 1024; 0 disables; anything else is
// a qg::Error naming the variable), else 2 GiB or an eighth of the physical memory if less.
// Always 0 in AddressSanitizer builds (a cached block would hide a use after free), though a
// bad QG_CPU_CACHE_BYTES is still an error there.
size_t default_cpu_cache_limit();
// Parses a QG_CPU_CACHE_BYTES value as above.
size_t parse_cpu_cache_bytes(const char* text);

// The process's CPU allocator (cpu_allocator()) and its cache.
CpuCacheStats cpu_cache_stats();
void set_cpu_cache_limit(size_t bytes);
void release_cpu_cache();

}  // namespace qg
