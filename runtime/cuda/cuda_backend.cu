#include "runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <memory>

#include "runtime/backend.h"
#include "runtime/cuda/cuda_allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_error.h"

namespace qg {

namespace cuda {

cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t created;
    QG_CUDA_CHECK("cuda_backend", cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    return created;
  }();
  return s;
}

int multiprocessor_count() {
  static int count = [] {
    int dev = 0, n = 0;
    QG_CUDA_CHECK("cuda_backend", cudaGetDevice(&dev));
    QG_CUDA_CHECK("cuda_backend", cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return count;
}

int64_t l2_cache_bytes() {
  static int64_t bytes = [] {
    int dev = 0, n = 0;
    QG_CUDA_CHECK("cuda_backend", cudaGetDevice(&dev));
    QG_CUDA_CHECK("cuda_backend", cudaDeviceGetAttribute(&n, cudaDevAttrL2CacheSize, dev));
    return int64_t{n};
  }();
  return bytes;
}

LaunchShape elementwise_launch(int64_t n, int threads) {
  int64_t want = (n + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 8;
  return {static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap))),
          static_cast<unsigned>(threads)};
}

namespace {

__global__ void probe_kernel(int* out) {
  if (out != nullptr) out[threadIdx.x] = 1;
}

}  // namespace

void launch_probe(unsigned threads_per_block) {
  probe_kernel<<<1, threads_per_block, 0, stream()>>>(nullptr);
  QG_CUDA_CHECK_LAUNCH("launch_probe");
  QG_CUDA_CHECK("launch_probe", cudaStreamSynchronize(stream()));
}

namespace {

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  QG_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  // Host-visible copies complete before returning; device-to-device stays asynchronous.
  if (dst_device.is_cpu() || src_device.is_cpu())
    QG_CUDA_CHECK("copy", cudaStreamSynchronize(stream()));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  void* stream() const override { return cuda::stream(); }
  void synchronize() override {
    QG_CUDA_CHECK("cuda_backend", cudaStreamSynchronize(cuda::stream()));
  }
  void after_kernel(const Node& node) override { QG_CUDA_CHECK(node.op->name, cudaGetLastError()); }
  void after_run(const Graph& graph) override { check_device_errors(&graph); }

 private:
  int index_;
};

}  // namespace
}  // namespace cuda

bool cuda_device_present() {
  static bool present = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return present;
}

std::unique_ptr<Backend> make_cuda_backend(int index) {
  QG_CHECK(cuda_device_present(), "cuda_backend", "device cuda:", index,
           " requested but no CUDA device is present");
  int n = 0;
  QG_CUDA_CHECK("cuda_backend", cudaGetDeviceCount(&n));
  QG_CHECK(index >= 0 && index < n, "cuda_backend", "device cuda:", index, " does not exist (", n,
           " devices)");
  QG_CUDA_CHECK("cuda_backend", cudaSetDevice(index));
  static bool installed = false;
  if (!installed) {
    install_device_allocator(DeviceType::cuda, &cuda::allocator(index), cuda::copy);
    installed = true;
  }
  return std::make_unique<cuda::CudaBackend>(index);
}

}  // namespace qg
