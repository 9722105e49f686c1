// Host data exchanged through the communicator's own memory (device buffers for NCCL): byte
// strings of any length gathered from every rank, and f64 values reduced over the ranks, for
// what happens once in a while on the host, such as the optimizer-state shards a checkpoint
// collects or the losses a trainer reports.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "device/communicator.h"

namespace qg::dist {

// Every rank's `mine`, in rank order. `device` is where the communicator's buffers live (a
// CUDA device for NCCL, the CPU for Gloo). Blocks until done; every rank must call it.
std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine,
                                          Device device);

// `values` (host memory) reduced over the ranks in place: the same bits on every rank.
// `device` as for all_gather_bytes. Blocks until done; every rank must call it.
void all_reduce_host(Communicator& comm, double* values, int64_t count, ReduceOp op, Device device);

}  // namespace qg::dist
