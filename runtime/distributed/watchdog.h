// The watchdog of a data-parallel process whose collectives can block where no timeout
// reaches them: an NCCL kernel waiting on the GPU for a peer that died spins until that
// process is torn down, and the host thread waiting for the stream never returns. A thread
// of its own watches the peers through rank 0's store (tcp_store.h), on a connection of its
// own that the store marks gone when it closes without a goodbye:
//   - a peer that reported a failure ("qg/failed/<rank>", ProcessGroup::report_failure);
//   - a peer whose process ended without a goodbye ("qg/gone/<rank>": killed, crashed);
//   - the store itself unreachable (rank 0 died).
// On the first of these it calls `on_failure` once, with a message naming the rank, from its
// own thread; ProcessGroup's handler prints it and ends the process (the driver then tears
// the GPU work down). A clean exit says goodbye first, so finishing is never taken for dying.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/distributed/tcp_store.h"

namespace qg::dist {

class Watchdog {
 public:
  using Handler = std::function<void(const std::string& message)>;
  // Connects to the store at host:port (within `timeout`) as rank `rank` of `world`, and
  // checks the peers every `period`.
  Watchdog(const std::string& host, int port, int rank, int world,
           std::chrono::milliseconds timeout, std::chrono::milliseconds period, Handler on_failure);
  // Says goodbye (this rank leaves cleanly) and stops the thread.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The failure message of the first check that found one (tests); empty when none did.
  std::string check_once();

 private:
  void run();

  int rank_, world_;
  std::chrono::milliseconds period_;
  Handler on_failure_;
  std::unique_ptr<TcpStoreClient> store_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace qg::dist
