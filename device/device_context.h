// The state of one device that kernels run with: the stream their work is queued on, the
// library handles bound to it (cuBLAS, cuDNN), the buffer in which kernels record the
// failures they cannot throw, and the precision switches. Every executor owns one (through
// its backend), so two executors on two streams or two devices share none of it, and a
// kernel can be called without a graph by handing it a context.
//
// Contexts on one device share its caching allocator, which does not track streams: a block
// freed while its stream may still read it is safe to reuse on that stream only. Executor::run
// synchronises its stream before it returns, so executors used in turn never meet; two run at
// once from two threads would need a pool per stream.
//
// This header has no CUDA types: ops, the CPU backend and core's KernelContext refer to the
// context without seeing CUDA. The CUDA pieces are in device/cuda/cuda_context.h.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace qg {

class Communicator;  // device/communicator.h
class Graph;

// Precision switches of the GPU kernels run on a context. The CPU kernels ignore them.
struct PrecisionFlags {
  // Whether f32 GEMMs (matmul, batched_matmul) and convolutions may run on TF32 tensor
  // cores, like PyTorch's torch.backends.cuda.matmul.allow_tf32 and
  // torch.backends.cudnn.allow_tf32. Off by default: TF32 keeps 10 mantissa bits of each
  // operand, which breaks the 1e-5 agreement between the CPU and GPU backends and with
  // PyTorch's f32 results. It exists so training steps can be timed against PyTorch with
  // TF32 on both sides.
  bool allow_tf32 = false;

  // The flags a new context starts with unless told otherwise: QG_ALLOW_TF32=1 turns
  // allow_tf32 on (read when called, so each new context sees the current environment).
  static PrecisionFlags from_environment();
};

// The libraries whose handles a context owns.
enum class LibraryHandle : int { cublas = 0, cudnn = 1 };
inline constexpr int kLibraryHandleCount = 2;

class DeviceContext {
 public:
  virtual ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Device device() const { return device_; }
  // cudaStream_t on CUDA; null on the CPU.
  void* stream() const { return stream_; }
  // The device buffer kernels record failures in (cuda::DeviceErrorRecord*); null on the CPU.
  void* error_buffer() const { return error_buffer_; }

  PrecisionFlags& precision() { return precision_; }
  const PrecisionFlags& precision() const { return precision_; }
  bool allow_tf32() const { return precision_.allow_tf32; }
  // Applies to the GEMMs and convolutions enqueued afterwards (a CUDA graph keeps what it
  // captured).
  void set_allow_tf32(bool on) { precision_.allow_tf32 = on; }

  // Makes this context's device the calling thread's current one (kernels launch there).
  virtual void make_current() {}
  // Waits for all work queued on the context.
  virtual void synchronize() {}
  // Raises qg::Error naming `op` when the last kernel launch on this thread failed.
  virtual void check_launch(const std::string& op) { (void)op; }
  // Waits for the queued work, then raises the first failure kernels recorded since the
  // last call (clearing it), naming the node's op and name when `graph` is given.
  virtual void check_errors(const Graph* graph) { (void)graph; }
  // Copies `bytes`, ordered after the work already queued on this context; copies the host
  // can see (to or from CPU memory) have completed when this returns.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

  // The data-parallel communicator kernels sync their statistics through (observers, batch
  // norms, all_reduce); null in one process. Owned by the caller (runtime/distributed), who
  // keeps it alive as long as the context.
  Communicator* communicator() const { return communicator_; }
  void set_communicator(Communicator* comm) { communicator_ = comm; }
  // The communicator observers sync their statistics through, and the one batch norms sync
  // theirs through (SyncBatchNorm): the communicator unless that sync is switched off, which
  // leaves each rank with its own statistics as DDP does (to measure what the sync costs).
  Communicator* statistics_sync() const { return sync_statistics_ ? communicator_ : nullptr; }
  Communicator* batch_norm_sync() const { return sync_batch_norm_ ? communicator_ : nullptr; }
  void set_sync_statistics(bool on) { sync_statistics_ = on; }
  void set_sync_batch_norm(bool on) { sync_batch_norm_ = on; }

  // The handle of `which` owned by this context: made by `create` on first use (before a
  // CUDA graph capture, as any one-time set-up) and destroyed by `destroy` with the context.
  // Libraries keep their handles here rather than in globals, so that a handle is bound to
  // one stream and never shared between two contexts.
  using CreateHandle = void* (*)(DeviceContext& context);
  using DestroyHandle = void (*)(void* handle);
  void* library_handle(LibraryHandle which, CreateHandle create, DestroyHandle destroy);

 protected:
  DeviceContext(Device device, void* stream, void* error_buffer, PrecisionFlags precision);
  // Destroys the library handles; a derived context calls it while its stream still exists.
  void release_library_handles();

 private:
  Device device_;
  void* stream_;
  void* error_buffer_;
  PrecisionFlags precision_;
  Communicator* communicator_ = nullptr;
  bool sync_statistics_ = true;
  bool sync_batch_norm_ = true;
  struct Handle {
    void* handle = nullptr;
    DestroyHandle destroy = nullptr;
  };
  Handle handles_[kLibraryHandleCount];
};

struct ContextOptions {
  PrecisionFlags precision = PrecisionFlags::from_environment();
  // CUDA: a cudaStream_t to run on, owned by the caller (who keeps it alive as long as the
  // context); null makes the context create and own a stream of its own.
  void* stream = nullptr;
  // CUDA: a zeroed device buffer of one cuda::DeviceErrorRecord, owned by the caller (kept as
  // long as the context); null makes the context allocate its own. Contexts sharing one
  // record can be made while a CUDA graph is being captured (no cudaMalloc then): the torch
  // ops make one per stream they meet, the capture stream among them.
  void* error_record = nullptr;
  // The communicator of a data-parallel run (DeviceContext::communicator); null: one process.
  Communicator* communicator = nullptr;
  bool sync_statistics = true;  // DeviceContext::statistics_sync
  bool sync_batch_norm = true;  // DeviceContext::batch_norm_sync
};

// A context on `device`: the CPU always; a CUDA device when built with CUDA and the device
// exists (else qg::Error saying which). Creating a CUDA context also installs the CUDA
// allocator, so tensors on the device can be created before any executor exists.
std::unique_ptr<DeviceContext> make_device_context(Device device,
                                                   const ContextOptions& options = {});

// Whether a CUDA device is present (false when built without CUDA). When one is, the CUDA
// allocator is installed too, so CUDA tensors can be made before any context exists.
bool cuda_available();

}  // namespace qg
