// Median timing of a launch function on the CPU (steady clock) or the CUDA stream (events
// around each launch, after warm-up), and the device-copy baseline.
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace qg::bench {

// `warmup` < 0 picks max(3, reps / 10) warm-up launches.
double median_us(Device device, const std::function<void(int)>& launch, int reps, int warmup = -1);
// Median time to copy `bytes` within the device (memcpy on the CPU, cudaMemcpyAsync D2D).
double copy_us(Device device, int64_t bytes, int reps);

}  // namespace qg::bench
