// Starts N local ranks of a program with the torchrun variables set (what `qat train
// --nproc N` does), waits for them, and stops them all as soon as one fails: a rank that
// exits non-zero or is killed gives the others `grace` to fail on their own (their
// collectives error out once its connections close), then they are sent SIGTERM and, a
// second later, SIGKILL. Nothing is left running.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace qg::dist {

struct LocalLaunch {
  std::vector<std::string> argv;  // argv[0] is the program's path
  int nproc = 2;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this host
  std::chrono::milliseconds grace{60000};
  // Variables set in every rank besides the torchrun ones (NCCL_NVLS_ENABLE=0 always is,
  // unless the environment sets it).
  std::vector<std::pair<std::string, std::string>> env;
};

struct LaunchResult {
  int failed_rank = -1;    // the first rank that failed; -1: all exited 0
  int exit_code = 0;       // its exit code, or 128 + signal
  std::string what;        // "rank 1 (pid 123) was killed by signal 9"; empty when all passed
  std::vector<int> codes;  // every rank's exit code (128 + signal when killed)
};

// Throws qg::Error when a rank cannot be started.
LaunchResult launch_local(const LocalLaunch& launch);

// A TCP port no socket of this host is bound to now.
int free_port();

}  // namespace qg::dist
