#include "runtime/distributed/launch_env.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace qg::dist {
namespace {

// The integer value of variable `name`, or `fallback` when unset.
long long env_int(const char* name, long long fallback, long long lo, long long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  QG_CHECK(*v != '\0' && end != nullptr && *end == '\0' && errno == 0, "launch", name, "='", v,
           "' is not an integer");
  QG_CHECK(x >= lo && x <= hi, "launch", name, "=", x, " is outside [", lo, ", ", hi, "]");
  return x;
}

}  // namespace

std::optional<LaunchEnv> LaunchEnv::from_environment() {
  if (std::getenv("WORLD_SIZE") == nullptr) return std::nullopt;
  LaunchEnv e;
  e.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1, 1 << 16));
  QG_CHECK(std::getenv("RANK") != nullptr || e.world_size == 1, "launch",
           "WORLD_SIZE=", e.world_size, " is set but RANK is not");
  e.rank = static_cast<int>(env_int("RANK", 0, 0, 1 << 16));
  QG_CHECK(e.rank < e.world_size, "launch", "RANK=", e.rank,
           " is outside [0, WORLD_SIZE=", e.world_size, ")");
  e.local_rank = static_cast<int>(env_int("LOCAL_RANK", e.rank, 0, 1 << 16));
  const char* addr = std::getenv("MASTER_ADDR");
  QG_CHECK(addr != nullptr || e.world_size == 1, "launch", "WORLD_SIZE=", e.world_size,
           " needs MASTER_ADDR (the host of rank 0)");
  if (addr != nullptr) {
    QG_CHECK(*addr != '\0', "launch", "MASTER_ADDR is empty");
    e.master_addr = addr;
  }
  QG_CHECK(std::getenv("MASTER_PORT") != nullptr || e.world_size == 1, "launch",
           "WORLD_SIZE=", e.world_size, " needs MASTER_PORT (the port of rank 0's store)");
  e.master_port = static_cast<int>(env_int("MASTER_PORT", 29500, 1, 65535));
  return e;
}

std::string LaunchEnv::str() const {
  std::ostringstream os;
  os << "RANK=" << rank << " WORLD_SIZE=" << world_size << " LOCAL_RANK=" << local_rank
     << " MASTER_ADDR=" << master_addr << " MASTER_PORT=" << master_port;
  return os.str();
}

std::chrono::milliseconds timeout_from_environment(std::chrono::milliseconds fallback) {
  const char* v = std::getenv("QG_DIST_TIMEOUT");
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  QG_CHECK(*v != '\0' && *end == '\0' && s > 0, "launch", "QG_DIST_TIMEOUT='", v,
           "' is not a positive number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0));
}

}  // namespace qg::dist
