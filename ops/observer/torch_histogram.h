// PyTorch HistogramObserver's algorithm for one histogram (one tensor or one channel):
// histc binning, range growth by up-sampling the old histogram onto the combined range
// (_adjust_min_max + _combine_histograms) and the L2-error search for the clipping range
// (_non_linear_param_search). Float operations follow PyTorch 1.13's dtypes and order (f32
// tensors, f64 Python scalars) so the chosen range lands on the same bins.
// One deliberate difference: PyTorch 1.13 passes int(min)/int(max) as histc's bounds (it
// truncates the range, fixed in later releases); we bin over the true f32 range.
#pragma once

#include <cstdint>
#include <vector>

namespace qg {

struct TorchHistogram {
  float* hist = nullptr;  // [bins], f32 counts (merging makes them fractional)
  float* min = nullptr;
  float* max = nullptr;
  uint8_t* initialized = nullptr;
  int64_t bins = 2048;
};

// Adds one batch of finite values (in memory order) to `h`; an empty batch changes nothing.
void torch_histogram_update(TorchHistogram h, const std::vector<float>& values,
                            int64_t upsample_rate);

// The clipping range [lo, hi] chosen by the L2 search; `dst_nbins` = 2^bits.
void torch_histogram_search(const TorchHistogram& h, int64_t dst_nbins, float& lo, float& hi);

}  // namespace qg
