// The bounds behind the CUDA group packer's fast path for groups without +/-Inf
// (Int4Codec::encode_finite in ops/int4/int4_cuda.cu): with the parameters of int4_math.h
// in f32, every finite x of a group has
//   symmetric:  |rint(x * inv)| <= 7, so the code rint(x * inv) + 8 needs no clamp;
//   asymmetric: rint(x * inv) + zp >= 0 and |x * inv| < 16, so only the clamp to 15 is
//               needed and the 32-bit integer steps cannot overflow.
// Both sides of the range are monotone in x, so the group's extremes are the ones checked:
// exhaustive mantissas of absmax where the scale is subnormal or the reciprocal is near
// overflow, and random ranges over the whole exponent range (ranges wider than f32 and
// degenerate ones included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "ops/int4/int4_math.h"

namespace qg {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The f32 product the kernels round (encode multiplies x by inv_scale).
float scaled(float x, const int4::GroupParams<float>& p) {
  volatile float y = x * p.inv_scale;  // one f32 rounding, whatever the host's evaluation
  return y;
}

void check_symmetric(float absmax) {
  const auto p = int4::symmetric_params<float>(absmax);
  for (float x : {absmax, -absmax}) {
    const float r = qmath::round_even(scaled(x, p));
    ASSERT_LE(std::fabs(r), 7.0f) << "absmax " << absmax << " scale " << p.scale;
  }
}

void check_asymmetric(float mn, float mx) {
  const auto p = int4::asymmetric_params<float>(mn, mx);
  const float zp = p.zero_point;
  for (float x : {mn, mx}) {
    const float y = scaled(x, p);
    ASSERT_LT(std::fabs(y), 16.0f) << "range " << mn << " " << mx;
    ASSERT_GE(qmath::round_even(y) + zp, 0.0f) << "range " << mn << " " << mx << " zp " << zp;
  }
}

TEST(Int4CodeRange, SymmetricFiniteCodesNeedNoClamp) {
  // Every 3rd mantissa of the binades around the smallest kept scale (absmax / 7 near
  // 2^-128, where inv overflows), of normal scales and of absmax up to FLT_MAX.
  for (uint32_t exp_bits : {1u, 2u, 3u, 4u, 127u, 253u, 254u}) {
    for (uint32_t m = 0; m < (1u << 23); m += 3) check_symmetric(from_bits(exp_bits << 23 | m));
  }
  for (uint32_t b = 0; b < (1u << 23); b += 5) check_symmetric(from_bits(b));  // subnormal
  check_symmetric(std::numeric_limits<float>::max());
  check_symmetric(0.0f);
}

TEST(Int4CodeRange, AsymmetricFiniteCodesStayAboveZeroAndSmall) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7fffffu);  // finite, non-negative
  std::uniform_int_distribution<int> pick(0, 5);
  for (int i = 0; i < 400000; ++i) {
    float a = from_bits(bits(rng)), b = from_bits(bits(rng));
    switch (pick(rng)) {
      case 0:
        a = -a;
        break;  // mixed signs
      case 1:
        a = -a;
        b = -b;
        break;  // all negative
      case 2:
        a = -a;
        b = a * 0.75f;
        break;  // narrow negative range
      case 3:
        b = std::nextafter(a, 0.0f);
        break;  // narrow positive range
      case 4:
        a = 0.0f;
        break;  // min 0
      default:
        a = -std::ldexp(1.0f, 127);
        break;  // range wider than f32
    }
    check_asymmetric(std::fmin(a, b), std::fmax(a, b));
  }
  check_asymmetric(0.0f, 0.0f);
  check_asymmetric(-std::numeric_limits<float>::max(), std::numeric_limits<float>::max());
  check_asymmetric(-std::numeric_limits<float>::denorm_min(), 0.0f);
}

}  // namespace
}  // namespace qg
