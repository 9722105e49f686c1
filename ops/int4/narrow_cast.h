// Correctly rounded f64 -> f16/bf16 conversion for CPU kernels. Eigen converts double to
// half through float, rounding twice, which can differ from a single round-to-nearest-even
// (NumPy's astype and CUDA's __double2half are single roundings). Rounding to float with
// round-to-odd first makes the second rounding exact.
#pragma once

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/half.h"

namespace qg {

template <typename T, typename M>
T narrow_cast(M v) {
  if constexpr (std::is_same_v<M, double> && (std::is_same_v<T, f16> || std::is_same_v<T, bf16>)) {
    float f = static_cast<float>(v);
    if (std::isfinite(f) && static_cast<double>(f) != v) {
      // Round to odd: truncate toward zero, then set the last mantissa bit.
      if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      bits |= 1u;
      std::memcpy(&f, &bits, sizeof bits);
    }
    return static_cast<T>(f);
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace qg
