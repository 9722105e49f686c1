// Shared helpers for the core tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/caching_cpu_allocator.h"
#include "core/error.h"

namespace qg::testing {

// Asserts that `fn` throws qg::Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected qg::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
  }
}

// Sets the process CPU allocator's cache limit for the scope (emptying its cache first) and
// restores the old limit after; a test that needs the cache sets it explicitly, as the
// default is 0 under AddressSanitizer.
class ScopedProcessCacheLimit {
 public:
  explicit ScopedProcessCacheLimit(size_t bytes) : old_(cpu_cache_stats().limit_bytes) {
    release_cpu_cache();
    set_cpu_cache_limit(bytes);
  }
  ~ScopedProcessCacheLimit() { set_cpu_cache_limit(old_); }
  ScopedProcessCacheLimit(const ScopedProcessCacheLimit&) = delete;
  ScopedProcessCacheLimit& operator=(const ScopedProcessCacheLimit&) = delete;

 private:
  size_t old_;
};

}  // namespace qg::testing
