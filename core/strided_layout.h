// Where the elements of a strided view lie: the offset, in elements from the view's first
// one, of the element with a given row-major index. Strided kernels (KernelDef::strided) walk
// their output in order and read each input through one of these, on the host or the GPU.
#pragma once

#include <cstdint>
#include <string>

#include "core/host_device.h"
#include "core/tensor.h"

namespace qg {

inline constexpr int kMaxStridedRank = 8;

struct StridedLayout {
  int rank = 0;
  bool contiguous = true;  // offset(i) == i: kernels take the plain path
  int64_t sizes[kMaxStridedRank] = {};
  int64_t strides[kMaxStridedRank] = {};

  QG_HOST_DEVICE int64_t offset(int64_t index) const {
    if (contiguous) return index;
    int64_t at = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t size = sizes[d];
      at += (index % size) * strides[d];
      index /= size;
    }
    return at;
  }
};

// The layout of `t`; qg::Error naming `op` past kMaxStridedRank dimensions.
StridedLayout strided_layout(const std::string& op, const Tensor& t);

}  // namespace qg
