// Floats as integers in the same order: a < b (with -0 below +0 and the infinities at the
// ends) exactly when order_key(a) < order_key(b). Ranges kept as such keys combine by integer
// min/max, so a reduction over threads or ranks is exact and free of order effects; NaN has
// no place in this order and is filtered out before.
#pragma once

#include <cstdint>
#include <cstring>

namespace qg {

inline int32_t order_key(float v) {
  int32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b ^ ((b >> 31) & 0x7fffffff);
}

inline float key_float(int32_t k) {
  int32_t b = k ^ ((k >> 31) & 0x7fffffff);
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace qg
