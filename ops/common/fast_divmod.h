// Unsigned 32-bit division by a divisor fixed for a whole launch, as a multiply-high, an add
// and a shift (Granlund and Montgomery's method for invariant divisors) instead of the ~10
// instructions of a division by a runtime value. The index arithmetic of gather kernels
// divides every element's index by each dimension size; those sizes are known on the host.
//   l = ceil(log2 d), m = floor(2^32 * (2^l - d) / d) + 1 (below 2^32), and for n < 2^31:
//   n / d = (umulhi(m, n) + n) >> l. (The add cannot overflow: umulhi(m, n) < n.)
#pragma once

#include <cstdint>

#include "ops/common/quant_math.h"

namespace qg {

struct FastDivmod {
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  FastDivmod() = default;
  // d in [1, 2^31).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    shift = l;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1);
  }

  // n / divisor for n < 2^31.
  QG_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(multiplier, n);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{multiplier} * n) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

}  // namespace qg
