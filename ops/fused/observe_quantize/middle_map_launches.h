// Diagnostics, not part of the op's interface: how often the CUDA kernel for channels on a
// middle axis ran with each of its two thread-to-channel maps (cuda_cooperative_middle_axis.cuh):
// whole rows of the outer axis per grid sweep, or channel-major. Tests read the counts to check
// that a shape reaches the map it is meant to cover; only the CUDA launcher adds to them.
#pragma once

#include <cstdint>

namespace qg {

struct MiddleMapLaunches {
  int64_t rows = 0, channels = 0;
};

// Launches of each map since the process started.
MiddleMapLaunches fused_middle_map_launches();
void count_fused_middle_map_launch(bool channel_major);

}  // namespace qg
