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
// and its peers fail with a "peer closed the connection" error.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "device/communicator.h"
#include "runtime/distributed/launch_env.h"
#include "runtime/distributed/tcp_store.h"

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

 private:
  ProcessGroup() = default;
  LaunchEnv env_;
  GroupOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::unique_ptr<Communicator> cpu_;
  std::unique_ptr<Communicator> cuda_;
};

// Whether this build has each backend.
bool built_with_gloo();
bool built_with_nccl();

}  // namespace qg::dist
