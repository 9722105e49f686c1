// One data-parallel process's view of its group: the rendezvous store (served by rank 0),
// the communicators (Gloo for CPU memory; NCCL for CUDA memory when built with it), and the
// failure reports that let every rank name the rank that failed.
//
//   auto group = dist::ProcessGroup::connect(*dist::LaunchEnv::from_environment(), {});
//   options.context.communicator = &group->communicator(Device::cpu());
//
// Faults: every collective has a timeout (60 s unless told otherwise, QG_DIST_TIMEOUT
// overrides). A rank that raises calls report_failure() before it exits, and its peers'
// collectives then fail at once (its connections close) with an error that quotes the
// report; a rank that dies without reporting is named by the launcher (qat train --nproc),
// and its peers fail with a "peer closed the connection" error. NCCL collectives wait on the
// GPU, where no timeout reaches: there the watchdog (watchdog.h) ends every rank whose peer
// failed or died.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "device/communicator.h"
#include "runtime/distributed/launch_env.h"
#include "runtime/distributed/tcp_store.h"
#include "runtime/distributed/watchdog.h"

namespace qg::dist {

struct GroupOptions {
  std::chrono::milliseconds timeout{60000};
};

class ProcessGroup {
 public:
  // Rendezvous through rank 0's store at MASTER_ADDR:MASTER_PORT, then the Gloo full mesh
  // (when built with Gloo). Throws qg::Error when a rank does not arrive within the timeout.
  static std::unique_ptr<ProcessGroup> connect(const LaunchEnv& env, const GroupOptions& options);
  ~ProcessGroup();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const LaunchEnv& env() const { return env_; }
  // The communicator for buffers on `device`: Gloo on the CPU, NCCL on CUDA (created on
  // first use, its unique id broadcast through the store). Throws naming what is missing.
  Communicator& communicator(Device device);
  TcpStoreClient& store() { return *client_; }

  // Records this rank's failure in the store (best effort: never throws), so that peers
  // whose collectives fail can name it.
  void report_failure(const std::string& what) noexcept;
  // "rank 1 reported: ..." for every rank that reported a failure; empty when none did or
  // the store cannot be reached.
  std::string reported_failures() noexcept;
  // Starts the watchdog (watchdog.h) if it is not running, in a group of more than one. The
  // NCCL communicator starts it with the default handler, which prints the message and ends
  // the process with exit code 3 (QG_DIST_WATCHDOG=0 leaves it off).
  void start_watchdog(Watchdog::Handler on_failure = {});

 private:
  ProcessGroup() = default;
  LaunchEnv env_;
  GroupOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::unique_ptr<Communicator> cpu_;
  std::unique_ptr<Communicator> cuda_;
  std::unique_ptr<Watchdog> watchdog_;
};

// Whether this build has each backend.
bool built_with_gloo();
bool built_with_nccl();

}  // namespace qg::dist
