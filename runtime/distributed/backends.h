// Factories of the communicator backends, each defined in its own file and compiled only
// when CMake found the library (QG_WITH_GLOO, QG_WITH_NCCL).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "device/communicator.h"
#include "runtime/distributed/tcp_store.h"

namespace qg::dist {

// Called when a collective fails, to add what the store knows (which rank reported what).
using FailureReports = std::function<std::string()>;

// gloo_communicator.cpp: the Gloo TCP full mesh over `store` (keys under "gloo/").
std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size, TcpStoreClient& store,
                                                     const std::string& hostname,
                                                     std::chrono::milliseconds timeout,
                                                     FailureReports reports);
// nccl_communicator.cpp: one NCCL communicator on CUDA device `device`, its unique id made by
// rank 0 and published under "nccl/id".
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, int device,
                                                     TcpStoreClient& store,
                                                     std::chrono::milliseconds timeout,
                                                     FailureReports reports);

}  // namespace qg::dist
