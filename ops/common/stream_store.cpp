#include "ops/common/stream_store.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace qg::simd {
namespace {

constexpr int64_t kUnset = -1;
std::atomic<int64_t> g_stream_min_bytes{kUnset};

int64_t from_environment() {
  const char* env = std::getenv("QG_STREAM_MIN_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultStreamMinBytes;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  QG_CHECK(*end == '\0' && v >= 0, "stream stores", "QG_STREAM_MIN_BYTES = '", env,
           "' must be a non-negative integer (bytes)");
  return static_cast<int64_t>(v);
}

}  // namespace

int64_t stream_min_bytes() {
  int64_t v = g_stream_min_bytes.load(std::memory_order_relaxed);
  if (v == kUnset) {
    v = from_environment();
    g_stream_min_bytes.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_stream_min_bytes(int64_t bytes) {
  QG_CHECK(bytes >= 0, "stream stores", "stream_min_bytes = ", bytes, " must be >= 0");
  g_stream_min_bytes.store(bytes, std::memory_order_relaxed);
}

}  // namespace qg::simd
