// Test inputs for the 4-bit packing fast paths (tests/ops_int4, tests/ops_nf4): normal
// values at a random magnitude with NaN, +-Inf, +-0, +-3e38 (a range whose width overflows
// f32) and subnormals sprinkled in, and now and then a run of all zeros or all NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"

namespace qg::testing {

inline std::vector<float> fastpath_sample(std::mt19937& rng, int64_t n, double special) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = normal(rng) * mag;
    if (u(rng) < special) {
      const float specials[] = {std::nanf(""), -std::nanf(""), inf,   -inf,   0.0f,
                                -0.0f,         mag * 0.5f,     3e38f, -3e38f, 1e-39f};
      x = specials[rng() % 10];
    }
  }
  if (rng() % 8 == 0) std::fill(v.begin(), v.end(), rng() % 2 ? 0.0f : -0.0f);
  if (rng() % 16 == 0) std::fill(v.begin(), v.end(), std::nanf(""));
  return v;
}

template <typename T>
std::vector<T> narrow_all(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

inline uint32_t f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

}  // namespace qg::testing
