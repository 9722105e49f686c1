#include "device/cuda/launch.h"

#include <algorithm>
#include <mutex>

#include "device/cuda/cuda_allocator.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_context.h"

namespace qg::cuda {
namespace {

// One attribute of the current device, queried once per device index.
int device_attribute(cudaDeviceAttr attr, int (&cache)[kMaxDevices],
                     std::once_flag (&once)[kMaxDevices]) {
  int dev = 0;
  QG_CUDA_CHECK("cuda_device", cudaGetDevice(&dev));
  QG_CHECK(dev >= 0 && dev < kMaxDevices, "cuda_device", "device index ", dev, " is outside [0, ",
           kMaxDevices, ")");
  std::call_once(once[dev], [&] {
    QG_CUDA_CHECK("cuda_device", cudaDeviceGetAttribute(&cache[dev], attr, dev));
  });
  return cache[dev];
}

__global__ void probe_kernel(int* out) {
  if (out != nullptr) out[threadIdx.x] = 1;
}

}  // namespace

int multiprocessor_count() {
  static int count[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  return device_attribute(cudaDevAttrMultiProcessorCount, count, once);
}

int64_t l2_cache_bytes() {
  static int bytes[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  return device_attribute(cudaDevAttrL2CacheSize, bytes, once);
}

LaunchShape elementwise_launch(int64_t n, int threads) {
  int64_t want = (n + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 8;
  return {static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap))),
          static_cast<unsigned>(threads)};
}

void launch_probe(DeviceContext& context, unsigned threads_per_block) {
  context.make_current();
  probe_kernel<<<1, threads_per_block, 0, cuda_stream(context)>>>(nullptr);
  QG_CUDA_CHECK_LAUNCH("launch_probe");
  QG_CUDA_CHECK("launch_probe", cudaStreamSynchronize(cuda_stream(context)));
}

}  // namespace qg::cuda
