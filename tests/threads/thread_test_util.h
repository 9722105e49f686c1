// Helpers of the thread-count determinism tests: a graph case run with a given number of
// threads, every value and every state collected after each step, compared byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace qg::threads_test {

// Sets the thread count, with every loop of two or more chunks on the pool however small
// (min_parallel_work 0), and restores both.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : old_(num_threads()), old_work_(min_parallel_work()) {
    set_num_threads(n);
    set_min_parallel_work(0);
  }
  ~ThreadCount() {
    set_num_threads(old_);
    set_min_parallel_work(old_work_);
  }

 private:
  int old_;
  int64_t old_work_;
};

// Normal values of spread `scale`; with `specials`, NaN, +/-Inf and signed zeros at fixed
// places (and a run of zeros) so min/max ties and non-finite counts are exercised.
inline Tensor data(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0,
                   bool specials = true) {
  const int64_t n = shape_numel(shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  if (specials && n > 64) {
    for (int64_t k = 0; k < n; k += 997) v[k] = (k / 997) % 2 ? -0.0 : 0.0;
    v[n / 3] = NAN;
    v[n / 2] = INFINITY;
    v[n - 5] = -INFINITY;
    v[n - 1] = -0.0;
  }
  return Tensor::from_doubles(shape, v, dtype);
}

struct Case {
  std::string label;
  std::function<void(Graph&)> build;
  Executor::Feeds feeds;
  bool fuse = false;
  int steps = 2;
};

inline Tensor copy_of(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes()) std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

// Every value of every step and every state after it, run with `threads` threads.
inline std::vector<Tensor> run_case(const Case& c, int threads) {
  ThreadCount tc(threads);
  Graph g;
  c.build(g);
  if (c.fuse) optimize(g, PassOptions{});
  Executor ex(g);
  std::vector<Tensor> out;
  for (int step = 0; step < c.steps; ++step) {
    for (const Tensor& t : ex.run_all(c.feeds)) out.push_back(copy_of(t));
    for (int node = 0; node < g.num_nodes(); ++node)
      for (const Tensor& s : ex.states(node)) out.push_back(copy_of(s));
  }
  return out;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// Runs the case with 1, 2, 3 and 8 threads; every tensor must equal the 1-thread one.
inline void expect_same_for_every_thread_count(const Case& c) {
  SCOPED_TRACE(c.label);
  const std::vector<Tensor> one = run_case(c, 1);
  for (int threads : {2, 3, 8}) {
    const std::vector<Tensor> got = run_case(c, threads);
    ASSERT_EQ(got.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bytes(one[i], got[i]))
          << c.label << ": tensor " << i << " differs with " << threads << " threads";
  }
}

}  // namespace qg::threads_test
