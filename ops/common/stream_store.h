// Non-temporal ("streaming") stores for the large outputs of the CPU element-wise kernels.
//
// Why: an ordinary store to a line that is not in cache first reads that line from memory
// (read-for-ownership), so a map y = f(x) over a tensor larger than the caches moves x, y read
// and y written: 1.5x the bytes it needs. A streaming store (movntps / movntdq) writes whole
// lines through the write-combining buffers without reading them, and leaves them out of the
// cache, which is what an output too large to stay there for its consumer wants anyway.
//
// Only how bytes are written changes, never which bytes: results are identical either way.
// Streaming is used when
//  * the kernel's output is at least stream_min_bytes() (the tensor would not stay in the
//    last-level cache for the next op: below that, ordinary stores keep it there and win),
//  * the destination of a vector store is 16-byte aligned (movntps needs it; the kernels
//    check the first vector of a run, the rest follow as each step is a multiple of 16
//    bytes; an unaligned run takes the ordinary stores), and
//  * the build has SSE2 (every x86-64); elsewhere the loops are scalar and store normally.
// Streaming stores are weakly ordered: a chunk of a parallel loop that streamed calls
// stream_fence() before it returns, so the pool's join (a release) publishes its bytes.
#pragma once

#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace qg::simd {

// Outputs of at least this many bytes are streamed: QG_STREAM_MIN_BYTES when set (a
// non-negative integer, else a qg::Error), else kDefaultStreamMinBytes. Tests set it.
int64_t stream_min_bytes();
void set_stream_min_bytes(int64_t bytes);
// 16 MiB: see bench/results/cpu_stream_stores.md for the sizes measured.
constexpr int64_t kDefaultStreamMinBytes = int64_t{16} << 20;

#if defined(__SSE2__)
constexpr bool kHaveStreamStores = true;
#else
constexpr bool kHaveStreamStores = false;
#endif

// Whether a kernel writing `bytes` of output should stream it.
inline bool stream_output(int64_t bytes) {
  return kHaveStreamStores && bytes >= stream_min_bytes();
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Makes this thread's streaming stores visible before its later stores (the end of a chunk).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

#if defined(__SSE2__)
// 16 bytes to p, streamed (p 16-byte aligned) or stored normally (p anywhere).
template <bool kStream>
inline void store_ps(float* p, __m128 v) {
  if constexpr (kStream)
    _mm_stream_ps(p, v);
  else
    _mm_storeu_ps(p, v);
}
template <bool kStream>
inline void store_si128(void* p, __m128i v) {
  if constexpr (kStream)
    _mm_stream_si128(static_cast<__m128i*>(p), v);
  else
    _mm_storeu_si128(static_cast<__m128i*>(p), v);
}
#endif

}  // namespace qg::simd
