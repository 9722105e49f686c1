// Launch shapes and the device properties they depend on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device/device_context.h"

namespace qg::cuda {

// Launch configuration for a grid-stride element-wise kernel over n elements.
struct LaunchShape {
  unsigned blocks;
  unsigned threads;
};
LaunchShape elementwise_launch(int64_t n, int threads = 256);
// Properties of the current device, read once per device.
int multiprocessor_count();
// The L2 cache size in bytes (cudaDevAttrL2CacheSize).
int64_t l2_cache_bytes();
// Launches an empty kernel with the given block size on `context`'s stream and checks the
// launch: a size the device rejects (over 1024) raises qg::Error with CUDA's text. Used to
// test that path.
void launch_probe(DeviceContext& context, unsigned threads_per_block);

}  // namespace qg::cuda
