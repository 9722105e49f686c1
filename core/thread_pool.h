// The process's one CPU thread pool, and parallel loops whose results do not depend on the
// number of threads.
//
// Determinism: every loop is cut into chunks whose boundaries depend only on the problem size
// and a grain fixed by the kernel (chunk c is [c * grain, min(n, (c + 1) * grain))), never on
// the thread count; which thread runs a chunk is left to chance, so a chunk may only write
// what no other chunk writes, and partial results are combined in chunk order
// (parallel_reduce). With one thread the same chunks run one after the other.
//
// Size: `set_num_threads` (the `qat --threads` option), else QG_NUM_THREADS, else the CPUs the
// process may run on (its affinity mask). The calling thread runs chunks too, so n threads
// means n - 1 workers. A parallel loop inside a chunk runs inline on that thread (no deadlock,
// no second layer of threads), and loops started at once by several threads (several
// executors) share the same workers: the pool never runs more than its size plus the callers.
// An exception thrown by a chunk is rethrown to the caller: the one of the lowest-numbered
// failing chunk, as a single thread would have met it first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace qg {

// Threads a parallel loop uses, the caller included (>= 1).
int num_threads();
// Sets that number (>= 1; a qg::Error otherwise, or when called while a loop runs).
void set_num_threads(int n);
// QG_NUM_THREADS when set (a positive integer, else a qg::Error), else the CPUs in the
// process's affinity mask.
int default_num_threads();
// True on a thread that is running a chunk of a parallel loop.
bool in_parallel_region();

// A loop whose work is below this many element-equivalents (roughly a nanosecond each: an
// element of a memory-bound map, or 16 multiply-adds of a GEMM) runs on the calling thread,
// the same chunks in order: waking workers costs tens of microseconds, more than such a loop.
// Only who runs the chunks changes, never the results. Tests lower it to 0 so that every loop
// of two or more chunks runs on the pool.
int64_t min_parallel_work();
void set_min_parallel_work(int64_t work);
constexpr int64_t kDefaultMinParallelWork = int64_t{1} << 17;

namespace detail {
// A borrowed callable(int64_t chunk): no allocation per loop.
struct ChunkFn {
  const void* obj;
  void (*call)(const void*, int64_t);
  void operator()(int64_t c) const { call(obj, c); }
};
// Runs fn(c) for every c in [0, chunks) on the pool (chunks >= 2, not nested).
void run_chunks(int64_t chunks, ChunkFn fn);
bool run_inline(int64_t chunks, int64_t work);
}  // namespace detail

inline int64_t num_chunks(int64_t n, int64_t grain) {
  return n <= 0 ? 0 : (n + grain - 1) / grain;
}

// Calls fn(c) for c in [0, chunks), in parallel when `work` (element-equivalents, see
// min_parallel_work) is large enough.
template <typename Fn>
void parallel_chunks(int64_t chunks, const Fn& fn, int64_t work) {
  if (detail::run_inline(chunks, work)) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  detail::run_chunks(chunks, detail::ChunkFn{&fn, [](const void* f, int64_t c) {
                                               (*static_cast<const Fn*>(f))(c);
                                             }});
}

// Calls fn(begin, end) for every chunk [c * grain, min(n, (c + 1) * grain)) of [0, n). The
// work is n unless given (a loop over rows passes its element count).
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, const Fn& fn, int64_t work = -1) {
  grain = std::max<int64_t>(grain, 1);
  parallel_chunks(
      num_chunks(n, grain),
      [&](int64_t c) {
        const int64_t b = c * grain;
        fn(b, std::min(n, b + grain));
      },
      work < 0 ? n : work);
}

// map(begin, end) -> T per chunk, then combine(acc, partial) left to right in chunk order,
// starting from `init`.
template <typename T, typename Map, typename Combine>
T parallel_reduce(int64_t n, int64_t grain, T init, const Map& map, const Combine& combine) {
  grain = std::max<int64_t>(grain, 1);
  std::vector<T> partial(static_cast<size_t>(num_chunks(n, grain)), init);
  parallel_for(n, grain, [&](int64_t b, int64_t e) { partial[b / grain] = map(b, e); });
  T acc = init;
  for (const T& p : partial) acc = combine(acc, p);
  return acc;
}

// The element grain of element-wise kernels: 16384 elements (64 KiB of f32), a multiple of
// 64 so that chunks of a bit mask (8 elements per byte) or of packed 4-bit codes never share
// a byte.
constexpr int64_t kElementGrain = int64_t{1} << 14;

}  // namespace qg
