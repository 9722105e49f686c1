#ifdef QG_WITH_NCCL
#include "runtime/distributed/peer_mailbox_ipc.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace qg::dist {
namespace {

// Data words per slot: an observer's channels (one word each) and its count. 8191 keeps a
// slot at 64 KiB; an inbox is 2 x ranks slots (256 KiB for two ranks).
constexpr int64_t kCapacity = 8191;

#define QG_IPC_CHECK(call)                                                        \
  do {                                                                            \
    cudaError_t qg_ipc_r = (call);                                                \
    QG_CHECK(qg_ipc_r == cudaSuccess, "peer_mailbox", "rank ", rank, ": ", #call, \
             " failed: ", cudaGetErrorString(qg_ipc_r));                          \
  } while (0)

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

bool enabled_here() {
  const char* v = std::getenv("QG_PEER_MAILBOX");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Every rank's `value` for `key`, in rank order (this rank's set first).
std::vector<std::string> exchange(TcpStoreClient& store, const std::string& key, int rank, int size,
                                  const std::string& value, std::chrono::milliseconds timeout) {
  store.set(key + "/" + std::to_string(rank), value);
  std::vector<std::string> all;
  for (int r = 0; r < size; ++r) all.push_back(store.get(key + "/" + std::to_string(r), timeout));
  return all;
}

}  // namespace

std::unique_ptr<PeerMailboxIpc> PeerMailboxIpc::open(int rank, int size, int device,
                                                     TcpStoreClient& store,
                                                     std::chrono::milliseconds timeout,
                                                     std::string& why_not) {
  QG_IPC_CHECK(cudaSetDevice(device));
  std::unique_ptr<PeerMailboxIpc> box(new PeerMailboxIpc);
  PeerMailbox& m = box->mailbox_;
  m.rank = rank;
  m.ranks = size;
  m.capacity = kCapacity;
  const bool fits = size >= 2 && size <= PeerMailbox::kMaxRanks;
  // 1. The inbox, zeroed (no flag raised), and its handle, with this rank's host and verdict.
  cudaIpcMemHandle_t handle{};
  bool ok = enabled_here() && fits;
  if (ok) {
    const size_t inbox_words = static_cast<size_t>(2 * size * (m.capacity + 1));
    // The inbox, then the exchange count and the broken flag.
    QG_IPC_CHECK(cudaMalloc(&box->own_, (inbox_words + 2) * sizeof(unsigned long long)));
    QG_IPC_CHECK(cudaMemset(box->own_, 0, (inbox_words + 2) * sizeof(unsigned long long)));
    QG_IPC_CHECK(cudaDeviceSynchronize());
    m.exchanges = static_cast<unsigned long long*>(box->own_) + inbox_words;
    m.broken = m.exchanges + 1;
    ok = cudaIpcGetMemHandle(&handle, box->own_) == cudaSuccess;
    (void)cudaGetLastError();
  }
  const std::string mine = std::string(ok ? "1" : "0") + host_name() + '\0' +
                           std::string(reinterpret_cast<const char*>(&handle), sizeof handle);
  const std::vector<std::string> all = exchange(store, "peer/handle", rank, size, mine, timeout);
  std::vector<cudaIpcMemHandle_t> handles(size);
  std::string host0;
  for (int r = 0; r < size; ++r) {
    const std::string& e = all[r];
    const size_t end = e.find('\0');
    QG_CHECK(end != std::string::npos && e.size() == end + 1 + sizeof handle, "peer_mailbox",
             "rank ", rank, ": rank ", r, "'s mailbox entry is ", e.size(), " bytes, malformed");
    const std::string host = e.substr(1, end - 1);
    if (r == 0) host0 = host;
    // The first reason found is the one reported (the same on every rank).
    if (why_not.empty() && e[0] != '1')
      why_not = !fits ? std::to_string(size) + " ranks (the mailbox takes 2 to " +
                            std::to_string(PeerMailbox::kMaxRanks) + ")"
                      : "rank " + std::to_string(r) + " has none (QG_PEER_MAILBOX=0 or no IPC)";
    else if (why_not.empty() && host != host0)
      why_not = "rank " + std::to_string(r) + " is on host " + host + ", rank 0 on " + host0;
    std::memcpy(&handles[r], e.data() + end + 1, sizeof handle);
  }
  // 2. Every peer's inbox mapped here; every rank says whether it managed.
  bool mapped = why_not.empty();
  if (mapped) {
    for (int r = 0; r < size && mapped; ++r) {
      if (r == rank) {
        m.inbox[r] = static_cast<unsigned long long*>(box->own_);
        continue;
      }
      void* p = nullptr;
      mapped = cudaIpcOpenMemHandle(&p, handles[r], cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
      (void)cudaGetLastError();
      if (mapped) m.inbox[r] = static_cast<unsigned long long*>(p);
    }
  }
  const std::vector<std::string> maps =
      exchange(store, "peer/mapped", rank, size, mapped ? "1" : "0", timeout);
  for (int r = 0; r < size && why_not.empty(); ++r)
    if (maps[r] != "1") why_not = "rank " + std::to_string(r) + " cannot map its peers' memory";
  box->set_timeout(timeout);
  if (!why_not.empty()) return nullptr;  // the destructor unmaps and frees what was made
  return box;
}

PeerMailboxIpc::~PeerMailboxIpc() {
  for (int r = 0; r < mailbox_.ranks; ++r)
    if (r != mailbox_.rank && mailbox_.inbox[r] != nullptr)
      (void)cudaIpcCloseMemHandle(mailbox_.inbox[r]);
  if (own_ != nullptr) (void)cudaFree(own_);
}

void PeerMailboxIpc::set_timeout(std::chrono::milliseconds timeout) {
  mailbox_.timeout_ns = static_cast<unsigned long long>(timeout.count()) * 1000000ull;
}

}  // namespace qg::dist
#endif  // QG_WITH_NCCL
