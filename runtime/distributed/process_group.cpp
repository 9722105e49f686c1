#include "runtime/distributed/process_group.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "runtime/distributed/backends.h"

namespace qg::dist {
namespace {

// The group of one: every collective is the identity (avg divides by 1).
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(DeviceType memory) : memory_(memory) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  DeviceType memory() const override { return memory_; }
  void all_reduce(void*, int64_t, DType, ReduceOp, void*) override {}
  void broadcast(void*, int64_t, int root, void*) override {
    QG_CHECK(root == 0, "broadcast", "root ", root, " in a group of one");
  }
  void all_gather(const void* in, void* out, int64_t bytes, void* stream) override;
  void barrier() override {}
  void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  DeviceType memory_;
  std::chrono::milliseconds timeout_{60000};
};

void LocalCommunicator::all_gather(const void* in, void* out, int64_t bytes, void*) {
  QG_CHECK(memory_ == DeviceType::cpu, "all_gather", "the local CUDA stand-in has no copy");
  if (in != out)
    std::copy(static_cast<const char*>(in), static_cast<const char*>(in) + bytes,
              static_cast<char*>(out));
}

// The address Gloo's TCP device binds to: QG_GLOO_HOSTNAME when set; 127.0.0.1 when rank 0
// is on this host's loopback (one-host runs and tests); else this host's name.
std::string gloo_hostname(const LaunchEnv& env) {
  if (const char* h = std::getenv("QG_GLOO_HOSTNAME")) return h;
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return "127.0.0.1";
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

}  // namespace

bool built_with_gloo() {
#ifdef QG_WITH_GLOO
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#ifdef QG_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<ProcessGroup> ProcessGroup::connect(const LaunchEnv& env,
                                                    const GroupOptions& options) {
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->env_ = env;
  g->options_ = options;
  if (env.world_size == 1) {
    g->cpu_ = std::make_unique<LocalCommunicator>(DeviceType::cpu);
    return g;
  }
  if (env.rank == 0) g->server_ = std::make_unique<TcpStoreServer>(env.master_port);
  g->client_ = std::make_unique<TcpStoreClient>(env.master_addr, env.master_port, options.timeout);
#ifdef QG_WITH_GLOO
  ProcessGroup* self = g.get();
  g->cpu_ = make_gloo_communicator(env.rank, env.world_size, *g->client_, gloo_hostname(env),
                                   options.timeout, [self] { return self->reported_failures(); });
#endif
  return g;
}

ProcessGroup::~ProcessGroup() {
  // The watchdog says goodbye first, then rank 0 keeps the store up until every watched peer
  // has said its own (or is gone), so no peer still finishing takes the store's exit for
  // rank 0's death.
  watchdog_.reset();
  if (server_) server_->wait_for_watchers(env_.rank, options_.timeout);
}

void ProcessGroup::start_watchdog(Watchdog::Handler on_failure) {
  if (watchdog_ || env_.world_size == 1) return;
  if (!on_failure)
    on_failure = [](const std::string& message) {
      std::fprintf(stderr, "qatgraph watchdog: %s; ending this process\n", message.c_str());
      std::fflush(stderr);
      std::_Exit(3);
    };
  watchdog_ = std::make_unique<Watchdog>(env_.master_addr, env_.master_port, env_.rank,
                                         env_.world_size, options_.timeout,
                                         std::chrono::milliseconds(200), std::move(on_failure));
}

Communicator& ProcessGroup::communicator(Device device) {
  if (device.is_cpu()) {
    // Without Gloo a group still rendezvouses (CUDA ranks need only NCCL and the store).
    QG_CHECK(cpu_ != nullptr, "launch", "WORLD_SIZE=", env_.world_size,
             " on the CPU needs the Gloo backend, and qatgraph was built without Gloo (install "
             "libgloo-dev and reconfigure)");
    return *cpu_;
  }
  if (!cuda_) {
    if (env_.world_size == 1) {
      cuda_ = std::make_unique<LocalCommunicator>(DeviceType::cuda);
    } else {
      QG_CHECK(built_with_nccl(), "launch", "WORLD_SIZE=", env_.world_size, " on ", device.str(),
               " needs the NCCL backend, and qatgraph was built without NCCL");
#ifdef QG_WITH_NCCL
      ProcessGroup* self = this;
      cuda_ =
          make_nccl_communicator(env_.rank, env_.world_size, device.index, *client_,
                                 options_.timeout, [self] { return self->reported_failures(); });
      const char* off = std::getenv("QG_DIST_WATCHDOG");
      if (off == nullptr || std::string(off) != "0") start_watchdog();
#endif
    }
  }
  return *cuda_;
}

void ProcessGroup::report_failure(const std::string& what) noexcept {
  if (!client_) return;
  try {
    client_->set("qg/failed/" + std::to_string(env_.rank), what);
  } catch (...) {
    // The store is gone (rank 0 exited): the launcher and the peers' errors still tell.
  }
}

std::string ProcessGroup::reported_failures() noexcept {
  if (!client_) return "";
  std::string out;
  try {
    for (int r = 0; r < env_.world_size; ++r) {
      std::string v;
      if (client_->try_get("qg/failed/" + std::to_string(r), v))
        out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
               " reported: " + v;
    }
  } catch (...) {
    if (out.empty()) out = "the store of rank 0 is unreachable (rank 0 exited or died)";
  }
  return out;
}

}  // namespace qg::dist
