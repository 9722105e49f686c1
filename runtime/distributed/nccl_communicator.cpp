// The NCCL backend: collectives between the ranks' CUDA buffers. Compiled only when CMake
// found NCCL (beside the CUDA Toolkit or in PyTorch's nvidia-nccl wheel). The unique id is
// made by rank 0 and published through the rendezvous store, so one rendezvous serves Gloo
// and NCCL.
//
// Overlap: all_reduce runs on a communication stream of its own. It waits for an event
// recorded on the caller's stream (the gradients of the bucket are complete) and records an
// event of its own that wait_for() makes the bucket's readers wait on. Events recorded and
// waited on during a CUDA-graph capture become edges of the graph, so a captured step keeps
// the overlap (the communication stream forks from and joins the captured stream).
#ifdef QG_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <thread>

#include "core/error.h"
#include "runtime/distributed/backends.h"
#include "runtime/distributed/nccl_trace.h"
#include "runtime/distributed/peer_mailbox_ipc.h"

namespace qg::dist {
namespace {

#define QG_NCCL_CHECK(op, call)                                                                 \
  do {                                                                                          \
    ncclResult_t qg_nccl_r = (call);                                                            \
    QG_CHECK(qg_nccl_r == ncclSuccess || qg_nccl_r == ncclInProgress, op, "rank ", rank_, ": ", \
             #call, " failed: ", ncclGetErrorString(qg_nccl_r), reports());                     \
  } while (0)
#define QG_CUDA_OK(op, call)                                                                   \
  do {                                                                                         \
    cudaError_t qg_cuda_r = (call);                                                            \
    QG_CHECK(qg_cuda_r == cudaSuccess, op, #call, " failed: ", cudaGetErrorString(qg_cuda_r)); \
  } while (0)

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::i8:
      return ncclInt8;
    default:
      QG_FAIL("all_reduce", "NCCL backend: no reduction for dtype ", dtype_name(d));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, TcpStoreClient& store,
                   std::chrono::milliseconds timeout, FailureReports reports)
      : rank_(rank), size_(size), device_(device), timeout_(timeout), reports_(std::move(reports)) {
    QG_CUDA_OK("nccl", cudaSetDevice(device));
    // 1. The unique id: made by rank 0, published through the store.
    ncclUniqueId id;
    if (rank == 0) {
      QG_NCCL_CHECK("nccl", ncclGetUniqueId(&id));
      store.set("nccl/id", std::string(id.internal, sizeof id.internal));
    } else {
      std::string bytes = store.get("nccl/id", timeout);
      QG_CHECK(bytes.size() == sizeof id.internal, "nccl", "rank ", rank, ": the store holds a ",
               bytes.size(), "-byte NCCL id, expected ", sizeof id.internal);
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    // 2. A blocking communicator: its collectives are enqueued when the call returns, which
    //    a CUDA-graph capture needs. Every rank has the id by now (a rank that never came
    //    made the store wait above time out); one that dies later is caught by the launcher.
    QG_NCCL_CHECK("nccl", ncclCommInitRank(&comm_, size, id, rank));
    QG_CUDA_OK("nccl", cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    QG_CUDA_OK("nccl", cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    // 3. The peer mailbox, for the observers' syncs inside their kernels (peer_mailbox.h).
    mailbox_ = PeerMailboxIpc::open(rank, size, device, store, timeout, mailbox_why_not_);
  }

  ~NcclCommunicator() override {
    (void)cudaStreamSynchronize(comm_stream_);
    trace_.write();
    for (auto& [ptr, ev] : done_) (void)cudaEventDestroy(ev);
    (void)cudaEventDestroy(ready_);
    (void)cudaStreamDestroy(comm_stream_);
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
    mailbox_.reset();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  DeviceType memory() const override { return DeviceType::cuda; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op, void* stream) override {
    if (count == 0) return;
    auto s = static_cast<cudaStream_t>(stream);
    // Fork: the communication stream starts after the work queued on `s` so far.
    trace_.mark('i', count, s);
    QG_CUDA_OK("all_reduce", cudaEventRecord(ready_, s));
    QG_CUDA_OK("all_reduce", cudaStreamWaitEvent(comm_stream_, ready_, 0));
    trace_.mark('s', count, comm_stream_);
    QG_NCCL_CHECK("all_reduce", ncclAllReduce(data, data, static_cast<size_t>(count),
                                              nccl_type(dtype), nccl_op(op), comm_, comm_stream_));
    trace_.mark('e', count, comm_stream_);
    QG_CUDA_OK("all_reduce", cudaEventRecord(event_for(data), comm_stream_));
    if (stream == nullptr) QG_CUDA_OK("all_reduce", cudaStreamSynchronize(comm_stream_));
  }

  void wait_for(const void* buffer, void* stream) override {
    auto it = done_.find(buffer);
    if (it == done_.end()) return;
    trace_.mark('w', 0, static_cast<cudaStream_t>(stream));
    QG_CUDA_OK("all_reduce", cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), it->second, 0));
    trace_.mark('r', 0, static_cast<cudaStream_t>(stream));
  }

  void broadcast(void* data, int64_t bytes, int root, void* stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    QG_NCCL_CHECK("broadcast",
                  ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, s));
    if (s == nullptr) QG_CUDA_OK("broadcast", cudaStreamSynchronize(s));
  }

  void all_gather(const void* in, void* out, int64_t bytes, void* stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    QG_NCCL_CHECK("all_gather",
                  ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, comm_, s));
    if (s == nullptr) QG_CUDA_OK("all_gather", cudaStreamSynchronize(s));
  }

  void barrier() override {
    // An all-reduce of one byte on the device, waited for against the timeout.
    void* one = nullptr;
    QG_CUDA_OK("barrier", cudaMalloc(&one, 4));
    QG_NCCL_CHECK("barrier", ncclAllReduce(one, one, 1, ncclInt32, ncclSum, comm_, comm_stream_));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (cudaStreamQuery(comm_stream_) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        (void)ncclCommAbort(comm_);
        comm_ = nullptr;
        QG_FAIL("barrier", "rank ", rank_, " of ", size_, ": no answer within ", timeout_.count(),
                " ms", reports());
      }
      poll("barrier");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)cudaFree(one);
  }

  void set_timeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    if (mailbox_) mailbox_->set_timeout(timeout);  // kernels launched (or captured) afterwards
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  const PeerMailbox* peer_mailbox() const override {
    return mailbox_ ? &mailbox_->mailbox() : nullptr;
  }
  std::string peer_mailbox_status() const override {
    return mailbox_ ? "peer mailbox (CUDA IPC)" : "NCCL all-gather: " + mailbox_why_not_;
  }

 private:
  std::string reports() const {
    std::string r = reports_ ? reports_() : std::string();
    return r.empty() ? std::string() : " (" + r + ")";
  }

  // Waits for the communicator's pending asynchronous work (init) against the timeout;
  // aborts it and throws naming this rank on an error or when the time is up.
  void poll(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      QG_NCCL_CHECK(what, ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
        (void)ncclCommAbort(comm_);
        comm_ = nullptr;
        QG_FAIL(what, "rank ", rank_, " of ", size_, ": ",
                state == ncclInProgress ? std::string("timed out") : ncclGetErrorString(state),
                reports());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  cudaEvent_t event_for(const void* buffer) {
    auto it = done_.find(buffer);
    if (it != done_.end()) return it->second;
    cudaEvent_t ev;
    QG_CUDA_OK("all_reduce", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    done_.emplace(buffer, ev);
    return ev;
  }

  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  FailureReports reports_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::map<const void*, cudaEvent_t> done_;  // the last all-reduce into each buffer
  std::unique_ptr<PeerMailboxIpc> mailbox_;
  std::string mailbox_why_not_;
  CollectiveTrace trace_{rank_};             // QG_NCCL_TRACE (nccl_trace.h)
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, int device,
                                                     TcpStoreClient& store,
                                                     std::chrono::milliseconds timeout,
                                                     FailureReports reports) {
  return std::make_unique<NcclCommunicator>(rank, size, device, store, timeout, std::move(reports));
}

}  // namespace qg::dist
#endif  // QG_WITH_NCCL
