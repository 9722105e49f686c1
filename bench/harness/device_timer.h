// Median timing of a launch function on the CPU (steady clock) or on a context's CUDA stream
// (events around each launch, after warm-up), and the device-copy baseline.
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"
#include "device/device_context.h"

namespace qg::bench {

// `launch` enqueues its work on `context` (an executor's context: its stream is the one
// timed). `warmup` < 0 picks max(3, reps / 10) warm-up launches.
double median_us(const DeviceContext& context, const std::function<void(int)>& launch, int reps,
                 int warmup = -1);
// Median time to copy `bytes` within the device (memcpy on the CPU, cudaMemcpyAsync D2D).
double copy_us(Device device, int64_t bytes, int reps);
// Median time to copy `bytes` in host memory on the thread pool, cut as the element-wise
// kernels cut elements of `element_bytes` each (chunks of kElementGrain elements, work one
// per element), with the pool's current thread count: the
// reference a multithreaded CPU kernel is held against. One memcpy (copy_us) is not that
// reference: it runs on one thread and, above a threshold of a fraction of the L3 cache, glibc's
// memcpy switches to streaming stores, which the chunked kernels do not use.
double pool_copy_us(int64_t bytes, int64_t element_bytes, int reps);

}  // namespace qg::bench
