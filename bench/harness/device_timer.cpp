#include "bench/harness/device_timer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_context.h"
#endif

namespace qg::bench {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

double median_us(const DeviceContext& context, const std::function<void(int)>& launch, int reps,
                 int warmup) {
  const Device device = context.device();
  if (warmup < 0) warmup = std::max(3, reps / 10);
  std::vector<double> t;
  if (device.is_cpu()) {
    for (int i = 0; i < warmup; ++i) launch(i);
    for (int i = 0; i < reps; ++i) {
      auto a = std::chrono::steady_clock::now();
      launch(i);
      auto b = std::chrono::steady_clock::now();
      t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    return median(t);
  }
#ifdef QG_WITH_CUDA
  cudaStream_t s = cuda_stream(context);
  for (int i = 0; i < warmup; ++i) launch(i);
  QG_CUDA_CHECK("bench", cudaStreamSynchronize(s));
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) QG_CUDA_CHECK("bench", cudaEventCreate(&e));
  // Events around each launch; launches are enqueued back to back, so launch overhead that
  // hides behind the previous kernel does not count, as in a real step.
  for (int i = 0; i < reps; ++i) {
    QG_CUDA_CHECK("bench", cudaEventRecord(ev[2 * i], s));
    launch(i);
    QG_CUDA_CHECK("bench", cudaEventRecord(ev[2 * i + 1], s));
  }
  QG_CUDA_CHECK("bench", cudaStreamSynchronize(s));
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    QG_CUDA_CHECK("bench", cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t.push_back(ms * 1000.0);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(t);
#else
  QG_FAIL("bench", "built without CUDA");
#endif
}

double copy_us(Device device, int64_t bytes, int reps) {
  // Rotate over enough buffers that the copy is not served from cache.
  const int64_t cache_bytes = device.is_cpu() ? (64 << 20) : (128 << 20);
  int copies = static_cast<int>(
      std::min<int64_t>(16, std::max<int64_t>(1, cache_bytes / std::max<int64_t>(bytes, 1))));
  auto context = make_device_context(device);
  std::vector<Tensor> src, dst;
  for (int i = 0; i < copies; ++i) {
    Tensor h = Tensor::empty({bytes}, DType::u8);
    for (int64_t k = 0; k < bytes; ++k) h.data<uint8_t>()[k] = static_cast<uint8_t>(k * 31 + i);
    src.push_back(h.to(device));
    dst.push_back(Tensor::empty({bytes}, DType::u8, device));
  }
  return median_us(
      *context,
      [&](int i) {
        int k = i % copies;
        if (device.is_cpu()) {
          std::memcpy(dst[k].raw_data(), src[k].raw_data(), static_cast<size_t>(bytes));
        } else {
#ifdef QG_WITH_CUDA
          QG_CUDA_CHECK("bench", cudaMemcpyAsync(dst[k].raw_data(), src[k].raw_data(), bytes,
                                                 cudaMemcpyDeviceToDevice, cuda_stream(*context)));
#endif
        }
      },
      reps);
}

double pool_copy_us(int64_t bytes, int64_t element_bytes, int reps) {
  // Buffers allocated (and first touched by the warm-up launches) before timing, rotated
  // like copy_us so that the copy is not served from cache.
  const int64_t cache_bytes = 64 << 20;
  int copies = static_cast<int>(
      std::min<int64_t>(16, std::max<int64_t>(1, cache_bytes / std::max<int64_t>(bytes, 1))));
  std::vector<Tensor> src, dst;
  for (int i = 0; i < copies; ++i) {
    src.push_back(Tensor::empty({bytes}, DType::u8));
    dst.push_back(Tensor::empty({bytes}, DType::u8));
    std::memset(src.back().raw_data(), 0x5a + i, static_cast<size_t>(bytes));
  }
  return median_us(
      *make_device_context(Device::cpu()),
      [&](int i) {
        const auto* s = static_cast<const uint8_t*>(src[i % copies].raw_data());
        auto* d = static_cast<uint8_t*>(dst[i % copies].raw_data());
        // The element-wise kernels' chunks and work (one per element), so the copy makes the
        // same run-inline-or-on-the-pool decision as a kernel over these elements.
        parallel_for(
            bytes, kElementGrain * element_bytes,
            [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, static_cast<size_t>(e - b)); },
            bytes / element_bytes);
      },
      reps);
}

}  // namespace qg::bench
