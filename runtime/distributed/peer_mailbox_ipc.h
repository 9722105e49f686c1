// The host side of the peer mailbox (device/peer_mailbox.h): every CUDA rank allocates its
// inbox, publishes its CUDA IPC handle through the rendezvous store, and maps the others'.
// Compiled with the NCCL backend, whose communicator owns the mailbox.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "device/peer_mailbox.h"
#include "runtime/distributed/tcp_store.h"

namespace qg::dist {

class PeerMailboxIpc {
 public:
  // Every rank of the group calls this once (keys "peer/..." of `store`). The mailbox exists
  // on all ranks or on none: none when QG_PEER_MAILBOX=0 on some rank, the ranks are on
  // different hosts, there are more than PeerMailbox::kMaxRanks, or some rank cannot map
  // another's memory. `why_not` then says which. Store failures (a rank that never came)
  // throw, as the rest of the rendezvous does.
  static std::unique_ptr<PeerMailboxIpc> open(int rank, int size, int device, TcpStoreClient& store,
                                              std::chrono::milliseconds timeout,
                                              std::string& why_not);
  ~PeerMailboxIpc();
  PeerMailboxIpc(const PeerMailboxIpc&) = delete;
  PeerMailboxIpc& operator=(const PeerMailboxIpc&) = delete;

  const PeerMailbox& mailbox() const { return mailbox_; }
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  PeerMailboxIpc() = default;
  PeerMailbox mailbox_;
  void* own_ = nullptr;  // this rank's inbox and exchange count (cudaMalloc)
};

}  // namespace qg::dist
