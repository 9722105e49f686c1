// The thread pool behind core/thread_pool.h. A loop is a Job in a FIFO queue: the caller
// queues it, wakes as many workers as it has chunks to spare, and claims chunks itself from
// the job's atomic counter; workers claim from the oldest queued job. The first thread to
// find a job's counter exhausted takes it off the queue, so no thread joins it later, and the
// caller waits only for the workers already inside it. The caller never waits for a worker
// to wake: a small loop is often finished before any worker arrives.
#include "core/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include <Eigen/Core>

#include "core/error.h"

namespace qg {
namespace {

thread_local bool t_in_region = false;
std::atomic<int64_t> g_min_parallel_work{kDefaultMinParallelWork};

struct Job {
  detail::ChunkFn fn;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  // The lowest chunk that threw, and its exception: chunks after it are skipped.
  std::atomic<int64_t> failed{std::numeric_limits<int64_t>::max()};
  std::mutex error_mu;
  std::exception_ptr error;
  int workers_inside = 0;  // guarded by the pool's mutex

  void work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      if (c > failed.load(std::memory_order_relaxed)) continue;
      try {
        fn(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu);
        if (c < failed.load(std::memory_order_relaxed)) {
          failed.store(c, std::memory_order_relaxed);
          error = std::current_exception();
        }
      }
    }
  }
};

class ThreadPool {
 public:
  ~ThreadPool() { stop_workers(); }

  // Resolved on first use, so that --threads wins over a bad QG_NUM_THREADS.
  int threads() {
    int n = threads_.load(std::memory_order_relaxed);
    if (n == 0) {
      n = default_num_threads();
      threads_.store(n, std::memory_order_relaxed);
    }
    return n;
  }

  void resize(int n) {
    QG_CHECK(n >= 1, "threads", "the thread count must be >= 1, got ", n);
    QG_CHECK(!t_in_region, "threads", "set_num_threads called inside a parallel loop");
    {
      std::lock_guard<std::mutex> lk(mu_);
      QG_CHECK(running_ == 0, "threads", "set_num_threads called while ", running_,
               " parallel loop(s) run");
      threads_.store(n, std::memory_order_relaxed);
    }
    stop_workers();  // the next loop starts n - 1 new ones
  }

  void run(int64_t chunks, detail::ChunkFn fn) {
    Job job;
    job.fn = fn;
    job.chunks = chunks;
    int64_t helpers = 0, workers = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      start_workers_locked();
      ++running_;
      jobs_.push_back(&job);
      workers = static_cast<int64_t>(workers_.size());
      helpers = std::min<int64_t>(chunks - 1, workers);
    }
    if (helpers == workers)
      work_cv_.notify_all();
    else
      for (int64_t i = 0; i < helpers; ++i) work_cv_.notify_one();
    t_in_region = true;
    job.work();
    t_in_region = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      retire_locked(&job);
      done_cv_.wait(lk, [&] { return job.workers_inside == 0; });
      --running_;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void start_workers_locked() {
    const int want = threads() - 1;
    if (static_cast<int>(workers_.size()) == want) return;
    Eigen::initParallel();  // Eigen's GEMM is called from several threads at once
    const uint64_t gen = generation_;
    for (int i = static_cast<int>(workers_.size()); i < want; ++i)
      workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  // Workers of an older generation leave at their next wake-up; new ones start with the
  // next loop.
  void stop_workers() {
    std::vector<std::thread> old;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++generation_;
      old.swap(workers_);
    }
    work_cv_.notify_all();
    for (std::thread& t : old) t.join();
  }

  // Takes a job whose chunks are all claimed off the queue.
  void retire_locked(Job* job) {
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
      if (*it == job) {
        jobs_.erase(it);
        return;
      }
  }

  void worker_loop(uint64_t gen) {
    t_in_region = true;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return generation_ != gen || !jobs_.empty(); });
      if (generation_ != gen) return;
      Job* job = jobs_.front();
      ++job->workers_inside;
      lk.unlock();
      job->work();
      lk.lock();
      retire_locked(job);
      if (--job->workers_inside == 0) done_cv_.notify_all();
    }
  }

  std::atomic<int> threads_{0};  // 0: not resolved yet
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job*> jobs_;
  std::vector<std::thread> workers_;
  int running_ = 0;
  uint64_t generation_ = 0;
};

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

}  // namespace

int default_num_threads() {
  if (const char* env = std::getenv("QG_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    QG_CHECK(*end == '\0' && n >= 1 && n <= 4096, "threads", "QG_NUM_THREADS = '", env,
             "' is not a thread count in [1, 4096]");
    return static_cast<int>(n);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int num_threads() {
  return pool().threads();
}

void set_num_threads(int n) {
  QG_CHECK(n <= 4096, "threads", "the thread count must be <= 4096, got ", n);
  pool().resize(n);
}

bool in_parallel_region() {
  return t_in_region;
}

int64_t min_parallel_work() {
  return g_min_parallel_work.load(std::memory_order_relaxed);
}

void set_min_parallel_work(int64_t work) {
  g_min_parallel_work.store(std::max<int64_t>(work, 0), std::memory_order_relaxed);
}

namespace detail {

bool run_inline(int64_t chunks, int64_t work) {
  return chunks <= 1 || t_in_region || work < min_parallel_work() || pool().threads() == 1;
}

void run_chunks(int64_t chunks, ChunkFn fn) {
  pool().run(chunks, fn);
}

}  // namespace detail

}  // namespace qg
