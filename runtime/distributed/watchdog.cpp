#include "runtime/distributed/watchdog.h"

#include "core/error.h"

namespace qg::dist {

Watchdog::Watchdog(const std::string& host, int port, int rank, int world,
                   std::chrono::milliseconds timeout, std::chrono::milliseconds period,
                   Handler on_failure)
    : rank_(rank), world_(world), period_(period), on_failure_(std::move(on_failure)) {
  QG_CHECK(static_cast<bool>(on_failure_), "watchdog", "no failure handler");
  store_ = std::make_unique<TcpStoreClient>(host, port, timeout);
  store_->watch(rank);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    store_->bye();
  } catch (...) {
    // The store is gone already: nobody is left to take this exit for a death.
  }
}

std::string Watchdog::check_once() {
  try {
    std::string what;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      if (store_->try_get("qg/failed/" + std::to_string(r), what))
        return "rank " + std::to_string(r) + " reported: " + what;
      if (store_->try_get("qg/gone/" + std::to_string(r), what))
        return "rank " + std::to_string(r) +
               " ended without a goodbye (killed or crashed) while the run went on";
    }
  } catch (const std::exception&) {
    return "the store of rank 0 at " + store_->endpoint() +
           " stopped answering: rank 0 died or was killed";
  }
  return "";
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    const std::string failure = check_once();
    lock.lock();
    if (stopping_) return;
    if (!failure.empty()) {
      lock.unlock();
      on_failure_("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " +
                  failure);
      return;
    }
    wake_.wait_for(lock, period_, [this] { return stopping_; });
  }
}

}  // namespace qg::dist
