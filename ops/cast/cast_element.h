// One element of cast on the CPU: widen exactly to the source's math type (f32 for
// f16/bf16), convert to the destination's math type, then narrow once. So f64 -> f16/bf16
// rounds to f32 first, as torch's conversions (and Eigen's half/bfloat16 constructors) do,
// and every narrowing rounds to nearest, ties to even. A cast to the same dtype copies the
// bits (NaN payloads included). cast_cuda.cu follows the same steps.
#pragma once

#include <type_traits>

#include "core/half.h"

namespace qg {

template <typename Dst, typename Src>
Dst cast_element(Src v) {
  if constexpr (std::is_same_v<Src, Dst>)
    return v;
  else
    return static_cast<Dst>(static_cast<math_t<Dst>>(static_cast<math_t<Src>>(v)));
}

}  // namespace qg
