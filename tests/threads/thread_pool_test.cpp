// The process thread pool (core/thread_pool.h): chunk boundaries fixed by the problem size,
// every chunk run once, ordered reductions, nested loops inline, exceptions reaching the
// caller (the lowest failing chunk's), loops from several threads at once, and the
// thread-count settings (QG_NUM_THREADS, bad values).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/executor.h"
#include "tests/threads/thread_test_util.h"

namespace qg {
namespace {

using threads_test::ThreadCount;

TEST(ThreadPool, ChunksDependOnTheSizeOnlyAndRunOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadCount tc(threads);
    std::mutex mu;
    std::set<std::pair<int64_t, int64_t>> seen;
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(1000, 64, [&](int64_t b, int64_t e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        EXPECT_TRUE(seen.insert({b, e}).second);
      }
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    EXPECT_EQ(seen.size(), 16u);
    EXPECT_EQ(seen.begin()->second, 64);
    EXPECT_EQ(seen.rbegin()->first, 960);
    EXPECT_EQ(seen.rbegin()->second, 1000);
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ReduceCombinesInChunkOrder) {
  // Float sums whose value depends on the order: equal for every thread count.
  std::vector<float> v(100003);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(i % 977 + 1) * 1e3f;
  auto sum = [&] {
    return parallel_reduce(
        static_cast<int64_t>(v.size()), 1000, 0.0f,
        [&](int64_t b, int64_t e) {
          float s = 0;
          for (int64_t i = b; i < e; ++i) s += v[i];
          return s;
        },
        [](float a, float b) { return a + b; });
  };
  float one;
  {
    ThreadCount tc(1);
    one = sum();
  }
  for (int threads : {2, 3, 8}) {
    ThreadCount tc(threads);
    for (int rep = 0; rep < 5; ++rep) EXPECT_EQ(sum(), one);
  }
}

TEST(ThreadPool, NestedLoopsRunInlineOnTheChunksThread) {
  ThreadCount tc(4);
  std::atomic<int64_t> total{0};
  std::atomic<int> mismatched{0};
  parallel_for(64, 1, [&](int64_t, int64_t) {
    EXPECT_TRUE(in_parallel_region());
    const auto outer = std::this_thread::get_id();
    parallel_for(100, 7, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != outer) mismatched++;
      total += e - b;
    });
  });
  EXPECT_FALSE(in_parallel_region());
  EXPECT_EQ(total.load(), 6400);
  EXPECT_EQ(mismatched.load(), 0);
}

TEST(ThreadPool, TheLowestFailingChunksErrorReachesTheCaller) {
  for (int threads : {1, 2, 8}) {
    ThreadCount tc(threads);
    try {
      parallel_for(1000, 10, [&](int64_t b, int64_t) {
        if (b == 370 || b == 900) QG_FAIL("pool_test", "chunk at ", b);
      });
      ADD_FAILURE() << "expected qg::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), "pool_test");
      EXPECT_NE(std::string(e.what()).find("chunk at 370"), std::string::npos) << e.what();
    }
    // The pool still works afterwards.
    std::atomic<int> n{0};
    parallel_for(100, 1, [&](int64_t, int64_t) { n++; });
    EXPECT_EQ(n.load(), 100);
  }
}

TEST(ThreadPool, LoopsFromSeveralThreadsShareThePool) {
  ThreadCount tc(3);
  auto work = [](int seed, int64_t* out) {
    for (int rep = 0; rep < 50; ++rep) {
      *out = parallel_reduce(
          100000, 1000, int64_t{0},
          [&](int64_t b, int64_t e) {
            int64_t s = 0;
            for (int64_t i = b; i < e; ++i) s += (i * seed) % 7;
            return s;
          },
          [](int64_t a, int64_t b) { return a + b; });
    }
  };
  int64_t a = 0, b = 0, ref_a = 0, ref_b = 0;
  work(3, &ref_a);
  work(5, &ref_b);
  std::thread ta(work, 3, &a), tb(work, 5, &b);
  ta.join();
  tb.join();
  EXPECT_EQ(a, ref_a);
  EXPECT_EQ(b, ref_b);
}

// Two executors on two threads run the same graph at once: both get the one-thread answer.
TEST(ThreadPool, TwoExecutorsOnTwoThreads) {
  ThreadCount tc(3);
  Graph g;
  ValueId x = g.input("x", {DType::f32, {301, 257}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  std::vector<double> v(301 * 257);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i)) * 5.0;
  const Tensor in = Tensor::from_doubles({301, 257}, v);
  auto run = [&](Tensor* y) {
    Executor ex(g);
    for (int rep = 0; rep < 20; ++rep) *y = ex.run({{"x", in}}, {fq[0]})[0];
  };
  Tensor ref, a, b;
  {
    ThreadCount one(1);
    run(&ref);
  }
  std::thread t1(run, &a), t2(run, &b);
  t1.join();
  t2.join();
  ASSERT_EQ(ref.nbytes(), a.nbytes());
  EXPECT_EQ(std::memcmp(ref.raw_data(), a.raw_data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(ref.raw_data(), b.raw_data(), b.nbytes()), 0);
}

// Below min_parallel_work a loop runs its chunks in order on the calling thread.
TEST(ThreadPool, SmallLoopsRunOnTheCallingThread) {
  ThreadCount tc(4);
  set_min_parallel_work(1000);
  const auto caller = std::this_thread::get_id();
  std::vector<int64_t> order;
  parallel_for(999, 10, [&](int64_t b, int64_t) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(b);
  });
  ASSERT_EQ(order.size(), 100u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int64_t>(i) * 10);
  std::set<std::thread::id> ids;
  std::mutex mu;
  parallel_for(
      100, 1,
      [&](int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::lock_guard<std::mutex> lk(mu);
        ids.insert(std::this_thread::get_id());
      },
      1000);  // work given: enough for the pool
  EXPECT_GT(ids.size(), 1u);
}

TEST(ThreadPool, ThreadCountSettings) {
  EXPECT_GE(default_num_threads(), 1);
  EXPECT_THROW(set_num_threads(0), Error);
  EXPECT_THROW(set_num_threads(5000), Error);
  {
    ThreadCount tc(2);
    try {
      parallel_for(4, 1, [](int64_t, int64_t) { set_num_threads(3); });
      ADD_FAILURE() << "expected qg::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("inside a parallel loop"), std::string::npos);
    }
    EXPECT_EQ(num_threads(), 2);
  }
  const char* old = std::getenv("QG_NUM_THREADS");
  const std::string saved = old ? old : "";
  setenv("QG_NUM_THREADS", "5", 1);
  EXPECT_EQ(default_num_threads(), 5);
  for (const char* bad : {"0", "-2", "four", "3x", "99999"}) {
    setenv("QG_NUM_THREADS", bad, 1);
    try {
      default_num_threads();
      ADD_FAILURE() << "expected qg::Error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("QG_NUM_THREADS"), std::string::npos) << e.what();
    }
  }
  if (old)
    setenv("QG_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("QG_NUM_THREADS");
}

}  // namespace
}  // namespace qg
