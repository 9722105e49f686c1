// The launch environment torchrun defines (and any launcher that sets the same variables:
// Slurm with a wrapper, a shell loop, `qat train --nproc`):
//   RANK, WORLD_SIZE        this process's rank and the number of ranks
//   LOCAL_RANK              its rank on this host (picks the GPU); RANK when unset
//   MASTER_ADDR, MASTER_PORT  where rank 0 serves the rendezvous store
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace qg::dist {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // From the environment; nullopt when WORLD_SIZE is unset (one process). Throws qg::Error
  // naming the variable and its value when one is malformed or out of range (RANK outside
  // [0, WORLD_SIZE), a port outside 1..65535, MASTER_ADDR missing with WORLD_SIZE > 1).
  static std::optional<LaunchEnv> from_environment();
  // The variables as `export` would list them (for messages and for spawning ranks).
  std::string str() const;
};

// The collective timeout: QG_DIST_TIMEOUT (seconds, > 0) when set, else `fallback`.
std::chrono::milliseconds timeout_from_environment(std::chrono::milliseconds fallback);

}  // namespace qg::dist
