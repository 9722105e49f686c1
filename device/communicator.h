// The collective operations data-parallel training needs (all-reduce, broadcast, all-gather,
// barrier), as an interface that kernels reach through their DeviceContext without seeing
// runtime/: observers all-reduce their statistics, batch norms their sums, and the
// all_reduce op its gradient bucket. The implementations (Gloo for CPU memory, NCCL for
// CUDA memory) live in runtime/distributed/.
//
// Rules every caller keeps:
//  * Every rank calls the same collectives in the same order with the same sizes: kernels
//    decide whether to call from state that is identical on every rank (shapes, training
//    flag, observer_enabled), never from their own shard's data.
//  * A collective that cannot complete (a peer died, raised, or is stuck past the timeout)
//    throws qg::Error naming this rank and the operation; it never hangs.
//  * Results are bitwise identical on every rank (ring all-reduce: each chunk is reduced by
//    one rank, then copied to the others), so state derived from them stays in lockstep.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "device/peer_mailbox.h"

namespace qg {

enum class ReduceOp { sum, min, max, avg };
const char* reduce_op_name(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo", "nccl", or "local" for the one-process stand-in.
  virtual std::string backend() const = 0;
  // The kind of memory the buffers live in (CPU for Gloo, CUDA for NCCL).
  virtual DeviceType memory() const = 0;

  // In place over `count` elements of `dtype`. avg divides the sum by world_size() (in the
  // element type, after the sum, as DDP averages). `stream`: the cudaStream_t the NCCL call
  // is ordered on (null on the CPU, where the call completes before it returns).
  virtual void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op,
                          void* stream = nullptr) = 0;
  // Copies `bytes` from rank `root`'s buffer into everyone's.
  virtual void broadcast(void* data, int64_t bytes, int root, void* stream = nullptr) = 0;
  // out[r * bytes .. (r + 1) * bytes) = rank r's `in`.
  virtual void all_gather(const void* in, void* out, int64_t bytes, void* stream = nullptr) = 0;
  virtual void barrier() = 0;

  // Overlap (NCCL): an all_reduce may run on the communicator's own stream, after the
  // work queued on `stream` so far, and return at once. wait_for(buffer, stream) then orders
  // `stream` after the all-reduce that last wrote `buffer`, so the readers of a bucket wait
  // for it and nothing else does. A no-op where collectives complete before they return.
  virtual void wait_for(const void* buffer, void* stream) {
    (void)buffer;
    (void)stream;
  }

  // The inboxes through which kernels exchange small statistics with the other ranks of this
  // host (peer_mailbox.h), or null when there are none (another backend, ranks on several
  // hosts, no peer access between the GPUs, or QG_PEER_MAILBOX=0): the kernels then use the
  // collectives above. The same answer on every rank.
  virtual const PeerMailbox* peer_mailbox() const { return nullptr; }
  // How the observers' statistics travel, and why not through a mailbox when they do not.
  virtual std::string peer_mailbox_status() const { return "collectives (" + backend() + ")"; }

  // Applies to the collectives started afterwards.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

// Statistic syncs shared by the observer kernels (CPU buffers): after them every rank holds
// what one rank observing the concatenation of all shards would hold.
//
// Ranges as ordered integer keys (the keys of obsmath::ordered_min / ordered_max, where -0
// sorts below +0 and +/-inf are ordinary keys) and a count (the non-finite values), in one
// collective, one latency per observer and step: every rank's keys and count are gathered
// and folded (lo the minimum, hi the maximum over the ranks, the counts summed). Integer
// min/max is exact and order-free, so the result is bit for bit the single-process one.
// Returns the summed count.
int64_t all_reduce_range_keys_and_count(Communicator& comm, int32_t* lo, int32_t* hi, int64_t n,
                                        int64_t count);
// The same for f32 ranges stored as values (converted to keys and back).
int64_t all_reduce_ranges_and_count(Communicator& comm, float* mn, float* mx, int64_t n,
                                    int64_t count);
// Sums a counter over the ranks (the non-finite counts of the observers that gather lists).
int64_t all_reduce_count(Communicator& comm, int64_t count);
// Every rank's lists concatenated in rank order, list by list: list q of the result is
// rank 0's list q, then rank 1's, ... (what one process reading the ranks' shards one after
// the other, in memory order, would collect). For the observers whose statistics are not
// reductions (histogram, percentile): they then update from exactly the concatenated batch.
std::vector<std::vector<float>> all_gather_lists(Communicator& comm,
                                                 const std::vector<std::vector<float>>& lists);

}  // namespace qg
