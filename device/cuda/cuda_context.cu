#include "device/cuda/cuda_context.h"

#include <mutex>

#include "core/allocator.h"
#include "device/cuda/cuda_allocator.h"
#include "device/cuda/cuda_check.h"

namespace qg {

void install_cuda_allocator_once();  // below, after the allocator it installs

bool cuda_device_present() {
  static bool present = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    // Tensors may be created on a present device before any context exists.
    if (n > 0) install_cuda_allocator_once();
    return n > 0;
  }();
  return present;
}

namespace cuda {
namespace {

// Runs `body` with `device` current, then restores the caller's device.
template <typename Body>
void on_device(int device, Body body) {
  int current = 0;
  QG_CUDA_CHECK("cuda_context", cudaGetDevice(&current));
  if (current != device) QG_CUDA_CHECK("cuda_context", cudaSetDevice(device));
  body();
  if (current != device) QG_CUDA_CHECK("cuda_context", cudaSetDevice(current));
}

// The copy behind Tensor::to and copy_bytes, which have no context: the source may have
// been written, or the destination's previous owner still read, by work on any context's
// stream, so the device (both devices of a peer copy) finishes its queued work first; the
// copy then completes before returning. cudaMemcpy from pageable host memory returns once
// the bytes are staged, before the DMA into device memory has landed, and the contexts'
// non-blocking streams do not wait for the legacy stream that carries it: so a copy into a
// device also waits for its device, or a kernel or copy queued next on a context's stream
// could read the destination's old bytes.
void copy_without_context(void* dst, Device dst_device, const void* src, Device src_device,
                          size_t bytes) {
  for (Device d : {src_device, dst_device})
    if (!d.is_cpu()) on_device(d.index, [] { QG_CUDA_CHECK("copy", cudaDeviceSynchronize()); });
  QG_CUDA_CHECK("copy", cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  if (!dst_device.is_cpu())
    on_device(dst_device.index, [] { QG_CUDA_CHECK("copy", cudaDeviceSynchronize()); });
}

Allocator& device_allocator(int index) {
  return allocator(index);
}

class CudaContext final : public DeviceContext {
 public:
  CudaContext(int index, cudaStream_t stream, bool owns_stream, DeviceErrorRecord* record,
              bool owns_record, PrecisionFlags precision)
      : DeviceContext(Device::cuda(index), stream, record, precision),
        index_(index),
        owns_stream_(owns_stream),
        owns_record_(owns_record) {}

  ~CudaContext() override {
    // Teardown must not throw: errors (a driver already shutting down) are ignored.
    int current = 0;
    (void)cudaGetDevice(&current);
    (void)cudaSetDevice(index_);
    (void)cudaStreamSynchronize(cuda_stream(*this));
    release_library_handles();
    if (owns_record_) (void)cudaFree(error_buffer());
    if (owns_stream_) (void)cudaStreamDestroy(cuda_stream(*this));
    (void)cudaSetDevice(current);
  }

  void make_current() override {
    int current = 0;
    QG_CUDA_CHECK("cuda_context", cudaGetDevice(&current));
    if (current != index_) QG_CUDA_CHECK("cuda_context", cudaSetDevice(index_));
  }
  void synchronize() override {
    QG_CUDA_CHECK("cuda_context", cudaStreamSynchronize(cuda_stream(*this)));
  }
  void check_launch(const std::string& op) override { QG_CUDA_CHECK(op, cudaGetLastError()); }
  void check_errors(const Graph* graph) override {
    check_device_errors(error_record(*this), cuda_stream(*this), graph);
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t bytes) override {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
      copy_bytes(dst, dst_device, src, src_device, bytes);
      return;
    }
    cudaStream_t s = cuda_stream(*this);
    QG_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    // Host-visible copies complete before returning; device-to-device stays asynchronous.
    if (dst_device.is_cpu() || src_device.is_cpu()) QG_CUDA_CHECK("copy", cudaStreamSynchronize(s));
  }

 private:
  int index_;
  bool owns_stream_;
  bool owns_record_;
};

}  // namespace
}  // namespace cuda

void install_cuda_allocator_once() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    install_device_allocator(DeviceType::cuda, cuda::device_allocator, cuda::copy_without_context);
  });
}

std::unique_ptr<DeviceContext> make_cuda_context(int index, const ContextOptions& options) {
  QG_CHECK(cuda_device_present(), "device_context", "device cuda:", index,
           " requested but no CUDA device is present");
  int n = 0;
  QG_CUDA_CHECK("device_context", cudaGetDeviceCount(&n));
  QG_CHECK(index >= 0 && index < n && index < cuda::kMaxDevices, "device_context",
           "device cuda:", index, " does not exist (", n, " devices)");
  // The context's device becomes current, as a backend made for it expects.
  QG_CUDA_CHECK("device_context", cudaSetDevice(index));
  auto stream = static_cast<cudaStream_t>(options.stream);
  const bool owns_stream = stream == nullptr;
  if (owns_stream)
    QG_CUDA_CHECK("device_context", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* record = options.error_record;
  const bool owns_record = record == nullptr;
  if (owns_record) {
    cudaError_t err = cudaMalloc(&record, sizeof(cuda::DeviceErrorRecord));
    if (err == cudaSuccess) err = cudaMemset(record, 0, sizeof(cuda::DeviceErrorRecord));
    if (err != cudaSuccess) {
      (void)cudaFree(record);
      if (owns_stream) (void)cudaStreamDestroy(stream);
      QG_CUDA_CHECK("device_context", err);
    }
  }
  return std::make_unique<cuda::CudaContext>(index, stream, owns_stream,
                                             static_cast<cuda::DeviceErrorRecord*>(record),
                                             owns_record, options.precision);
}

}  // namespace qg
