#include "runtime/distributed/launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace qg::dist {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  QG_CHECK(fd >= 0, "launch", "socket(): ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  QG_CHECK(ok, "launch", "no free TCP port: ", std::strerror(errno));
  return ntohs(addr.sin_port);
}

namespace {

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

std::string describe(int rank, pid_t pid, int status) {
  std::string s = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (WIFSIGNALED(status))
    return s + " was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return s + " exited with code " + std::to_string(exit_code_of(status));
}

}  // namespace

LaunchResult launch_local(const LocalLaunch& launch) {
  QG_CHECK(launch.nproc >= 1, "launch", "--nproc ", launch.nproc, " must be >= 1");
  QG_CHECK(!launch.argv.empty(), "launch", "no program to start");
  const int port = launch.master_port > 0 ? launch.master_port : free_port();
  // 1. The environments, built before forking (the child only calls execve).
  std::map<std::string, std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) base[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (base.count("NCCL_NVLS_ENABLE") == 0) base["NCCL_NVLS_ENABLE"] = "0";
  for (const auto& [k, v] : launch.env) base[k] = v;
  base["WORLD_SIZE"] = std::to_string(launch.nproc);
  base["MASTER_ADDR"] = launch.master_addr;
  base["MASTER_PORT"] = std::to_string(port);
  std::vector<char*> argv;
  for (const std::string& a : launch.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<pid_t> pids(launch.nproc, -1);
  std::vector<std::vector<std::string>> envs(launch.nproc);
  for (int r = 0; r < launch.nproc; ++r) {
    std::map<std::string, std::string> env = base;
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    for (const auto& [k, v] : env) envs[r].push_back(k + "=" + v);
  }
  // 2. Start the ranks.
  for (int r = 0; r < launch.nproc; ++r) {
    std::vector<char*> envp;
    for (std::string& kv : envs[r]) envp.push_back(kv.data());
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      for (int k = 0; k < r; ++k) ::kill(pids[k], SIGKILL);
      for (int k = 0; k < r; ++k) ::waitpid(pids[k], nullptr, 0);
      QG_FAIL("launch", "cannot start rank ", r, ": ", std::strerror(err));
    }
    pids[r] = pid;
  }
  // 3. Wait; after the first failure the others get `grace`, then SIGTERM, then SIGKILL.
  LaunchResult result;
  result.codes.assign(launch.nproc, -1);
  int running = launch.nproc;
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline = Clock::time_point::max();
  bool terminated = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < launch.nproc; ++r) {
        if (pids[r] != pid) continue;
        --running;
        result.codes[r] = exit_code_of(status);
        if (result.codes[r] != 0 && result.failed_rank < 0 && !terminated) {
          result.failed_rank = r;
          result.exit_code = result.codes[r];
          result.what = describe(r, pid, status);
          deadline = Clock::now() + launch.grace;
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;  // no children left
    const auto now = Clock::now();
    if (now > deadline) {
      const int sig = terminated ? SIGKILL : SIGTERM;
      for (int r = 0; r < launch.nproc; ++r)
        if (result.codes[r] < 0) ::kill(pids[r], sig);
      terminated = true;
      deadline = now + std::chrono::seconds(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return result;
}

}  // namespace qg::dist
