// 1-bit-per-element masks: bit (i % 8) of byte (i / 8), least significant bit first.
#pragma once

#include <cstdint>

namespace qg {

inline int64_t bitmask_bytes(int64_t numel) {
  return (numel + 7) / 8;
}
inline bool bitmask_get(const uint8_t* m, int64_t i) {
  return (m[i >> 3] >> (i & 7)) & 1u;
}

}  // namespace qg
