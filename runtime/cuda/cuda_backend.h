// The CUDA backend: one stream for all work and copies, the caching allocator, and a
// launch-error check after every kernel.
#pragma once

#include <cuda_runtime.h>

#include "core/op_registry.h"

namespace qg::cuda {

cudaStream_t stream();
// Launch configuration for a grid-stride element-wise kernel over n elements.
struct LaunchShape {
  unsigned blocks;
  unsigned threads;
};
LaunchShape elementwise_launch(int64_t n, int threads = 256);
int multiprocessor_count();
// The device's L2 cache size in bytes (cudaDevAttrL2CacheSize), read once.
int64_t l2_cache_bytes();
// Launches an empty kernel with the given block size and checks the launch: a size the
// device rejects (over 1024) raises qg::Error with CUDA's text. Used to test that path.
void launch_probe(unsigned threads_per_block);

}  // namespace qg::cuda
