// The caching CPU allocator (core/caching_cpu_allocator.h): reuse, the limit, the switch-off,
// alignment, several threads at once, QG_CPU_CACHE_BYTES, and the process allocator behind
// Tensor::empty. Each test but the process-allocator ones owns its allocator instance, so
// they run the same under AddressSanitizer (where the process allocator does not cache).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/caching_cpu_allocator.h"
#include "core/tensor.h"
#include "tests/core/test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define QG_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QG_TEST_ASAN 1
#endif
#endif

namespace qg {
namespace {

using testing::expect_error;
using testing::ScopedProcessCacheLimit;

constexpr size_t kMiB = size_t{1} << 20;

TEST(CpuAllocator, FreedBlockIsReusedForTheSameSize) {
  CachingCpuAllocator a(64 * kMiB);
  void* p = a.allocate(kMiB);
  a.deallocate(p, kMiB);
  EXPECT_EQ(a.stats().cached_bytes, kMiB);
  EXPECT_EQ(a.stats().cached_blocks, 1u);
  void* q = a.allocate(kMiB);
  EXPECT_EQ(q, p);
  CpuCacheStats s = a.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.cached_bytes, 0u);
  // Another size class is not served from it.
  void* r = a.allocate(2 * kMiB);
  EXPECT_NE(r, q);
  EXPECT_EQ(a.stats().misses, 2u);
  a.deallocate(q, kMiB);
  a.deallocate(r, 2 * kMiB);
}

TEST(CpuAllocator, NearEqualSizesShareAClassAndTheNewestBlockComesFirst) {
  CachingCpuAllocator a(64 * kMiB);
  // 1 MiB + 1 and 1 MiB + 100 000 both round to 1 MiB + 128 KiB.
  ASSERT_EQ(CachingCpuAllocator::round_size(kMiB + 1), kMiB + 128 * 1024);
  void* older = a.allocate(kMiB + 1);
  void* newer = a.allocate(kMiB + 100000);
  a.deallocate(older, kMiB + 1);
  a.deallocate(newer, kMiB + 100000);
  EXPECT_EQ(a.allocate(kMiB + 5000), newer);
  EXPECT_EQ(a.allocate(kMiB + 64), older);
  a.deallocate(newer, kMiB + 5000);
  a.deallocate(older, kMiB + 64);
}

TEST(CpuAllocator, SizeClassesStayWithinAnEighthAndKeepTheAlignment) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4000}, size_t{65535},
                       size_t{65536}, size_t{65537}, size_t{100000}, kMiB - 1, kMiB, kMiB + 1,
                       size_t{3} * kMiB + 12345, size_t{128} * kMiB, size_t{200} * kMiB + 7}) {
    size_t r = CachingCpuAllocator::round_size(bytes);
    EXPECT_GE(r, bytes) << bytes;
    EXPECT_EQ(r % kCpuAlignment, 0u) << bytes;
    EXPECT_LE(r, bytes < CachingCpuAllocator::kMinCachedBytes ? bytes + kCpuAlignment - 1
                                                              : bytes + bytes / 8)
        << bytes;
    EXPECT_EQ(CachingCpuAllocator::round_size(r), r) << bytes;  // a class maps to itself
  }
}

TEST(CpuAllocator, LimitEvictsTheBlocksFreedLongestAgo) {
  CachingCpuAllocator a(3 * kMiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(a.allocate(kMiB));
  for (void* p : blocks) a.deallocate(p, kMiB);
  CpuCacheStats s = a.stats();
  EXPECT_EQ(s.cached_bytes, 3 * kMiB);
  EXPECT_EQ(s.cached_blocks, 3u);
  EXPECT_EQ(s.evictions, 1u);
  // blocks[0], freed first, went back to the system; the others come back newest first.
  EXPECT_EQ(a.allocate(kMiB), blocks[3]);
  EXPECT_EQ(a.allocate(kMiB), blocks[2]);
  EXPECT_EQ(a.allocate(kMiB), blocks[1]);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  for (int i = 1; i < 4; ++i) a.deallocate(blocks[i], kMiB);

  // A block larger than the whole limit is not kept, and evicts nothing.
  void* big = a.allocate(4 * kMiB);
  a.deallocate(big, 4 * kMiB);
  EXPECT_EQ(a.stats().cached_bytes, 3 * kMiB);
  EXPECT_EQ(a.stats().evictions, 1u);

  // Lowering the limit evicts down to it; 0 empties the cache.
  a.set_limit(kMiB + 1);
  EXPECT_EQ(a.stats().cached_bytes, kMiB);
  EXPECT_EQ(a.stats().limit_bytes, kMiB + 1);
  a.set_limit(0);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  EXPECT_EQ(a.stats().cached_blocks, 0u);
}

TEST(CpuAllocator, LimitZeroDisablesTheCache) {
  CachingCpuAllocator a(0);
  for (int i = 0; i < 3; ++i) {
    void* p = a.allocate(kMiB);
    a.deallocate(p, kMiB);
  }
  CpuCacheStats s = a.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
}

TEST(CpuAllocator, SmallBlocksBypassTheCache) {
  CachingCpuAllocator a(64 * kMiB);
  void* p = a.allocate(1000);
  a.deallocate(p, 1000);
  p = a.allocate(CachingCpuAllocator::kMinCachedBytes - 64);
  a.deallocate(p, CachingCpuAllocator::kMinCachedBytes - 64);
  CpuCacheStats s = a.stats();
  EXPECT_EQ(s.hits + s.misses, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(a.allocate(0), nullptr);
  a.deallocate(nullptr, 0);
}

TEST(CpuAllocator, ImpossibleSizesAreANamedError) {
  CachingCpuAllocator a(64 * kMiB);
  expect_error([&] { a.allocate(SIZE_MAX - 10); }, {"[cpu_allocator]", "out of host memory"});
#ifndef QG_TEST_ASAN  // AddressSanitizer aborts on such a request instead of returning null
  expect_error([&] { a.allocate(size_t{1} << 62); }, {"out of host memory allocating"});
#endif
}

TEST(CpuAllocator, EveryBlockIsAlignedFreshOrReused) {
  CachingCpuAllocator a(64 * kMiB);
  for (int round = 0; round < 2; ++round) {  // the second round is served from the cache
    std::vector<std::pair<void*, size_t>> held;
    for (size_t bytes : {size_t{1}, size_t{100}, size_t{70000}, kMiB + 3, size_t{5} * kMiB}) {
      void* p = a.allocate(bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kCpuAlignment, 0u) << bytes;
      std::memset(p, 0x5A, bytes);
      held.push_back({p, bytes});
    }
    for (auto [p, bytes] : held) a.deallocate(p, bytes);
  }
  EXPECT_EQ(a.stats().hits, 3u);
}

TEST(CpuAllocator, ThreadsAllocatingAndFreeingAtOnceNeverShareABlock) {
  // Each thread stamps its blocks with its own byte and checks the stamp before freeing: a
  // block handed to two threads at once would show the other's byte.
  CachingCpuAllocator a(8 * kMiB);
  constexpr int kThreads = 4, kIterations = 400;
  const size_t sizes[] = {64 * 1024, 200 * 1024, kMiB, 3 * kMiB};
  std::vector<int> corrupted(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const unsigned char stamp = static_cast<unsigned char>(0x10 + t);
      for (int i = 0; i < kIterations; ++i) {
        size_t bytes = sizes[(i * 7 + t) % 4];
        auto* p = static_cast<unsigned char*>(a.allocate(bytes));
        std::memset(p, stamp, bytes);
        std::this_thread::yield();
        for (size_t k = 0; k < bytes; k += 4096) corrupted[t] += p[k] != stamp;
        corrupted[t] += p[bytes - 1] != stamp;
        a.deallocate(p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(corrupted[t], 0) << "thread " << t;
  CpuCacheStats s = a.stats();
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(kThreads * kIterations));
  EXPECT_GT(s.hits, 0u);
  EXPECT_LE(s.cached_bytes, 8 * kMiB);
}

TEST(CpuAllocator, ParsesCacheBytes) {
  EXPECT_EQ(parse_cpu_cache_bytes("0"), 0u);
  EXPECT_EQ(parse_cpu_cache_bytes("12345"), 12345u);
  EXPECT_EQ(parse_cpu_cache_bytes("64k"), size_t{64} << 10);
  EXPECT_EQ(parse_cpu_cache_bytes("512M"), size_t{512} << 20);
  EXPECT_EQ(parse_cpu_cache_bytes("2G"), size_t{2} << 30);
  for (const char* bad : {"", "abc", "-1", "+5", " 5", "12X", "1MB", "1.5G", "99999999999999999999",
                          "17179869184G"}) {
    expect_error([&] { parse_cpu_cache_bytes(bad); },
                 {"QG_CPU_CACHE_BYTES = '" + std::string(bad) + "' is not a byte count"});
  }
}

// Sets QG_CPU_CACHE_BYTES for the scope and restores it after.
class ScopedCacheEnv {
 public:
  explicit ScopedCacheEnv(const char* value) {
    const char* old = std::getenv("QG_CPU_CACHE_BYTES");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("QG_CPU_CACHE_BYTES", value, 1);
  }
  ~ScopedCacheEnv() {
    if (had_)
      setenv("QG_CPU_CACHE_BYTES", old_.c_str(), 1);
    else
      unsetenv("QG_CPU_CACHE_BYTES");
  }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(CpuAllocator, DefaultLimitComesFromTheEnvironment) {
  {
    ScopedCacheEnv env("lots");  // an error in every build
    expect_error([] { default_cpu_cache_limit(); }, {"QG_CPU_CACHE_BYTES = 'lots'"});
  }
#ifdef QG_TEST_ASAN
  // Under AddressSanitizer the process allocator never caches, whatever the environment.
  ScopedCacheEnv env("1G");
  EXPECT_EQ(default_cpu_cache_limit(), 0u);
#else
  {
    ScopedCacheEnv env("0");
    EXPECT_EQ(default_cpu_cache_limit(), 0u);
  }
  {
    ScopedCacheEnv env("3M");
    EXPECT_EQ(default_cpu_cache_limit(), size_t{3} << 20);
  }
  {
    ScopedCacheEnv env("");  // empty: as if unset
    EXPECT_GT(default_cpu_cache_limit(), 0u);
    EXPECT_LE(default_cpu_cache_limit(), size_t{2} << 30);
  }
#endif
}

TEST(CpuAllocator, AddressSanitizerStillSeesAUseAfterFree) {
#ifdef QG_TEST_ASAN
  // The process allocator hands freed blocks straight back in this build, so ASan catches a
  // read of one.
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        Allocator& a = cpu_allocator();
        auto* p = static_cast<volatile unsigned char*>(a.allocate(kMiB));
        a.deallocate(const_cast<unsigned char*>(p), kMiB);
        std::printf("%d\n", p[100]);
      },
      "heap-use-after-free");
#else
  GTEST_SKIP() << "not an AddressSanitizer build";
#endif
}

TEST(CpuAllocator, TensorsReuseTheProcessCacheAndZerosStillClears) {
  ScopedProcessCacheLimit limit(64 * kMiB);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({256, 1024}, DType::f32);  // 1 MiB
    first = t.raw_data();
    t.fill(3.0);
  }
  const CpuCacheStats before = cpu_cache_stats();
  EXPECT_EQ(before.cached_bytes, kMiB);
  Tensor z = Tensor::zeros({256, 1024}, DType::f32);
  EXPECT_EQ(z.raw_data(), first);  // the freed block, still holding the 3.0s
  EXPECT_EQ(cpu_cache_stats().hits, before.hits + 1);
  const float* p = z.data<float>();
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(p[i], 0.0f) << i;
}

}  // namespace
}  // namespace qg
