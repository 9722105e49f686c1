// Device memory through which the CUDA ranks of one host exchange a few words of statistics
// from inside a kernel, without a collective launch: each rank's inbox is mapped into every
// other rank's address space (CUDA IPC), a writer stores its words into every inbox over
// NVLink, then raises its flag there; a reader waits for every rank's flag in its own inbox.
// An observer's sync then costs one NVLink round trip inside the kernel that needs it (a
// fused observer + quantizer keeps its single pass) rather than an NCCL all-gather launched
// between two kernels.
//
// Layout of an inbox: [2 parities][ranks] slots of (1 flag word + capacity data words), all
// 64-bit. Exchange e (1, 2, ...; every rank counts the same exchanges in the same order)
// writes parity e % 2 and raises flag = e. A rank reaches exchange e + 2, and so overwrites
// the parity of exchange e, only after every peer published e + 1, which each does after it
// finished reading e: two parities are enough. Flags are 64-bit counts and never wrap.
//
// Plain data (no CUDA types), so the Communicator interface can hand it to the kernels.
#pragma once

#include <cstdint>

namespace qg {

struct PeerMailbox {
  static constexpr int kMaxRanks = 8;
  int rank = 0;
  int ranks = 0;
  int64_t capacity = 0;  // data words per slot
  // inbox[p]: rank p's inbox, mapped into this process (inbox[rank] is this rank's own).
  unsigned long long* inbox[kMaxRanks] = {};
  // This rank's count of exchanges so far, in its device memory: kernels read and advance it,
  // so a replayed CUDA graph keeps counting.
  unsigned long long* exchanges = nullptr;
  // Set (in this rank's device memory) by the first wait that timed out: the two-parity rule
  // no longer holds once a rank stops waiting, so later exchanges on this rank stop waiting at
  // once, each recording the failure, instead of each waiting out the timeout.
  unsigned long long* broken = nullptr;
  // How long a kernel waits for a peer's flag before it records kPeerTimeout and goes on with
  // what it has (the watchdog ends a run whose rank died long before that).
  unsigned long long timeout_ns = 0;
};

}  // namespace qg
