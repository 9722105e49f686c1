// Bit-for-bit comparison of two tensors for the tests that hold a kernel to another kernel
// or to the CPU reference (SEMANTICS.md: CPU = GPU bit for bit).
#pragma once

#include <cmath>
#include <cstring>
#include <string>

#include "core/tensor.h"

namespace qg::testing {

// What counts as equal for NaN elements: the same bytes, or any NaN for any NaN. The second
// is for comparisons across backends of f32/f64 arithmetic on a NaN, whose payload and sign
// differ between x86 and CUDA on every path (SEMANTICS.md asks NaN -> NaN, not the payload).
enum class NanRule { same_bytes, any_payload };

// "" when a and b (copied to the host) have the same dtype and shape and every element the
// same bytes (NaNs as `nan` says); else what differs first, with both values.
inline std::string first_difference(const Tensor& a, const Tensor& b,
                                    NanRule nan = NanRule::same_bytes) {
  Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  if (ha.dtype() != hb.dtype() || ha.shape() != hb.shape())
    return "different tensors " + ha.str() + " vs " + hb.str();
  const size_t es = dtype_size(ha.dtype());
  const auto* pa = static_cast<const unsigned char*>(ha.raw_data());
  const auto* pb = static_cast<const unsigned char*>(hb.raw_data());
  for (int64_t i = 0; i < ha.numel(); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) == 0) continue;
    if (nan == NanRule::any_payload && std::isnan(ha.at(i)) && std::isnan(hb.at(i))) continue;
    return "element " + std::to_string(i) + ": " + std::to_string(ha.at(i)) + " vs " +
           std::to_string(hb.at(i));
  }
  return "";
}

}  // namespace qg::testing
