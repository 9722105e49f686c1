#include "ops/fused/observe_quantize/middle_map_launches.h"

#include <atomic>

namespace qg {
namespace {
std::atomic<int64_t> middle_rows_launches{0}, middle_channels_launches{0};
}  // namespace

MiddleMapLaunches fused_middle_map_launches() {
  return {middle_rows_launches.load(), middle_channels_launches.load()};
}

void count_fused_middle_map_launch(bool channel_major) {
  (channel_major ? middle_channels_launches : middle_rows_launches).fetch_add(1);
}

}  // namespace qg
