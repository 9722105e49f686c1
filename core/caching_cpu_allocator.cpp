#include "core/caching_cpu_allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iterator>

#include "core/error.h"

// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define QG_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QG_ASAN_BUILD 1
#endif
#endif

namespace qg {
namespace {

void* system_allocate(size_t rounded) {
  return std::aligned_alloc(kCpuAlignment, rounded);
}

}  // namespace

size_t CachingCpuAllocator::round_size(size_t bytes) {
  size_t granularity = kCpuAlignment;
  if (bytes >= kMinCachedBytes) {
    // An eighth of the largest power of two <= bytes: eight classes per doubling, so a class
    // is at most 1/8 above any request in it.
    size_t power = size_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(bytes)));
    granularity = std::max(granularity, power / 8);
  }
  return (bytes + granularity - 1) / granularity * granularity;
}

CachingCpuAllocator::CachingCpuAllocator(size_t limit_bytes) : limit_(limit_bytes) {}

CachingCpuAllocator::~CachingCpuAllocator() {
  release_cached();
}

void* CachingCpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  count_allocation(DeviceType::cpu);
  // No system has that much; the check keeps round_size from wrapping around.
  QG_CHECK(bytes <= (SIZE_MAX >> 1), "cpu_allocator", "out of host memory allocating ", bytes,
           " bytes");
  const size_t rounded = round_size(bytes);
  if (rounded >= kMinCachedBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto bucket = buckets_.find(rounded);
    if (bucket != buckets_.end() && !bucket->second.empty()) {
      Lru::iterator newest = bucket->second.back();
      bucket->second.pop_back();
      void* p = newest->ptr;
      lru_.erase(newest);
      cached_bytes_ -= rounded;
      ++hits_;
      return p;
    }
    ++misses_;
  }
  void* p = system_allocate(rounded);
  if (p == nullptr) {
    // Cached blocks of other sizes may be what the system is missing.
    release_cached();
    p = system_allocate(rounded);
  }
  QG_CHECK(p != nullptr, "cpu_allocator", "out of host memory allocating ", bytes, " bytes");
  return p;
}

void CachingCpuAllocator::evict_oldest_locked(Lru& evicted) {
  Lru::iterator oldest = std::prev(lru_.end());
  std::deque<Lru::iterator>& bucket = buckets_.at(oldest->bytes);
  // A bucket lists its blocks in the order they were freed, as lru_ does (backwards), so
  // the oldest block of all is the front of its bucket.
  assert(bucket.front() == oldest);
  bucket.pop_front();
  cached_bytes_ -= oldest->bytes;
  ++evictions_;
  evicted.splice(evicted.end(), lru_, oldest);  // moves the list node: cannot throw
}

void CachingCpuAllocator::free_blocks(const Lru& blocks) {
  for (const Block& b : blocks) std::free(b.ptr);
}

void CachingCpuAllocator::deallocate(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  const size_t rounded = round_size(bytes);
  Lru evicted;
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rounded >= kMinCachedBytes && rounded <= limit_) {
      while (cached_bytes_ + rounded > limit_) evict_oldest_locked(evicted);
      // Keeping the block allocates a list node and maybe a bucket slot; should that fail
      // (deallocate runs in destructors and must not throw), the block is freed instead.
      try {
        lru_.push_front(Block{ptr, rounded});
        try {
          buckets_[rounded].push_back(lru_.begin());
          cached_bytes_ += rounded;
          kept = true;
        } catch (...) {
          lru_.pop_front();
        }
      } catch (...) {
      }
    }
  }
  // Outside the lock: unmapping a large block takes a while.
  if (!kept) std::free(ptr);
  free_blocks(evicted);
}

void CachingCpuAllocator::set_limit(size_t bytes) {
  Lru evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    while (cached_bytes_ > limit_) evict_oldest_locked(evicted);
  }
  free_blocks(evicted);
}

void CachingCpuAllocator::release_cached() {
  Lru blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(lru_);
    buckets_.clear();
    cached_bytes_ = 0;
  }
  free_blocks(blocks);
}

CpuCacheStats CachingCpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CpuCacheStats s;
  s.limit_bytes = limit_;
  s.cached_bytes = cached_bytes_;
  s.cached_blocks = lru_.size();
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  return s;
}

size_t parse_cpu_cache_bytes(const char* text) {
  auto bad = [&] {
    QG_FAIL("cpu_allocator", "QG_CPU_CACHE_BYTES = '", text,
            "' is not a byte count (digits with an optional K, M or G suffix, e.g. 512M; "
            "0 disables the CPU allocator's cache)");
  };
  if (text == nullptr || *text < '0' || *text > '9') bad();
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  if (errno == ERANGE) bad();
  int shift = 0;
  switch (*end) {
    case '\0':
      break;
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    default:
      bad();
  }
  if (*end != '\0' && end[1] != '\0') bad();
  if (shift > 0 && n > (~0ull >> shift)) bad();
  return static_cast<size_t>(n << shift);
}

size_t default_cpu_cache_limit() {
  const char* env = std::getenv("QG_CPU_CACHE_BYTES");
  // Parsed in every build, so that a bad value is the same error everywhere.
  const bool set = env != nullptr && *env != '\0';
  const size_t from_env = set ? parse_cpu_cache_bytes(env) : 0;
#ifdef QG_ASAN_BUILD
  (void)from_env;
  return 0;
#else
  if (set) return from_env;
  size_t limit = size_t{2} << 30;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    limit = std::min(limit, static_cast<size_t>(pages) * static_cast<size_t>(page) / 8);
  return limit;
#endif
}

}  // namespace qg
