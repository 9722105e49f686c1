// Byte strings of any length gathered from every rank, through the communicator's own
// memory (device buffers for NCCL): for what happens once in a while on the host, such as
// the optimizer-state shards a checkpoint collects.
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

}  // namespace qg::dist
