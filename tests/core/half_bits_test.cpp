// core/half_bits.h: the f16 / bf16 conversions on edge values with their expected bits
// (ties, subnormals, overflow, Inf, NaN, -0), and agreement with Eigen's half / bfloat16,
// the conversion the CPU kernels run, on every 16-bit pattern and on the f32 rounding cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.h"

namespace qg {
namespace {

using half_bits::bf16_to_f32;
using half_bits::f16_to_f32;
using half_bits::f32_bits;
using half_bits::f32_from_bits;
using half_bits::f32_to_bf16;
using half_bits::f32_to_bf16_select;
using half_bits::f32_to_f16;
using half_bits::f32_to_f16_select;

struct Case {
  uint32_t f32;
  uint16_t want;
};

TEST(HalfBits, F32ToF16EdgeValues) {
  const std::vector<Case> cases = {
      {0x00000000u, 0x0000},  // +0
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x3f800000u, 0x3c00},  // 1
      {0x3f801000u, 0x3c00},  // 1 + 2^-11: tie between 0x3c00 and 0x3c01, to even
      {0x3f803000u, 0x3c02},  // 1 + 3 * 2^-11: tie between 0x3c01 and 0x3c02, to even
      {0x3f801001u, 0x3c01},  // just above the tie
      {0xbf801000u, 0xbc00},  // negative tie
      {0x477fe000u, 0x7bff},  // 65504, the largest f16
      {0x477fefffu, 0x7bff},  // just below 65520
      {0x477ff000u, 0x7c00},  // 65520: tie between 65504 (odd) and 2^16, rounds to Inf
      {0x7f7fffffu, 0x7c00},  // the largest f32 overflows to Inf
      {0xc77ff000u, 0xfc00},  // -65520 -> -Inf
      {0x7f800000u, 0x7c00},  // Inf
      {0xff800000u, 0xfc00},  // -Inf
      {0x38800000u, 0x0400},  // 2^-14, the smallest normal
      {0x387fc000u, 0x03ff},  // 1023 * 2^-24, the largest subnormal
      {0x387fe000u, 0x0400},  // tie between the largest subnormal (odd) and 2^-14
      {0x33800000u, 0x0001},  // 2^-24, the smallest subnormal
      {0x33000000u, 0x0000},  // 2^-25: tie between 0 and 2^-24, to even
      {0x33000001u, 0x0001},  // just above it
      {0x32ffffffu, 0x0000},  // just below it
      {0x33c00000u, 0x0002},  // 3 * 2^-25: tie between 1 and 2 units, to even
      {0x34200000u, 0x0002},  // 5 * 2^-25: tie between 2 and 3 units, to even
      {0xb3c00000u, 0x8002},  // negative subnormal tie
      {0x00000001u, 0x0000},  // f32 subnormal -> +0
      {0x80000001u, 0x8000},  // -> -0
      {0x7fc00000u, 0x7e00},  // quiet NaN
      {0x7f800001u, 0x7e00},  // signalling NaN, payload dropped
      {0xffc00001u, 0xfe00},  // negative NaN keeps its sign
      {0x7fffffffu, 0x7e00},
  };
  for (const Case& c : cases) {
    const float v = f32_from_bits(c.f32);
    EXPECT_EQ(f32_to_f16(v), c.want) << std::hex << c.f32;
    EXPECT_EQ(f32_to_f16_select(v), c.want) << std::hex << c.f32;
  }
}

TEST(HalfBits, F32ToBF16EdgeValues) {
  const std::vector<Case> cases = {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // +-0
      {0x3f800000u, 0x3f80},                         // 1
      {0x3f808000u, 0x3f80},                         // tie between 0x3f80 and 0x3f81, to even
      {0x3f818000u, 0x3f82},                         // tie between 0x3f81 and 0x3f82, to even
      {0x3f808001u, 0x3f81},                         // just above the tie
      {0xbf818000u, 0xbf82},                         // negative tie
      {0x7f7f7fffu, 0x7f7f},                         // rounds down to the largest bf16
      {0x7f7f8000u, 0x7f80},                         // tie at the top (odd) rounds to Inf
      {0x7f7fffffu, 0x7f80},                         // the largest f32 overflows to Inf
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // +-Inf
      {0x00008000u, 0x0000},                         // f32 subnormal tie, to even
      {0x00018000u, 0x0002},                         // f32 subnormal tie, to even
      {0x00008001u, 0x0001},                         // subnormals are kept, not flushed
      {0x80000001u, 0x8000},                         // -> -0
      {0x7fc00000u, 0x7fc0},                         // quiet NaN
      {0x7f800001u, 0x7fc0},                         // signalling NaN, payload dropped
      {0x7fffffffu, 0x7fc0},                         // no carry into the sign
      {0xffc00001u, 0xffc0},                         // negative NaN keeps its sign
  };
  for (const Case& c : cases) {
    const float v = f32_from_bits(c.f32);
    EXPECT_EQ(f32_to_bf16(v), c.want) << std::hex << c.f32;
    EXPECT_EQ(f32_to_bf16_select(v), c.want) << std::hex << c.f32;
  }
}

TEST(HalfBits, WideningEdgeValues) {
  EXPECT_EQ(f32_bits(f16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(f32_bits(f16_to_f32(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f16_to_f32(0x3c01), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32_bits(f16_to_f32(0x7c00)), 0x7f800000u);  // Inf
  EXPECT_EQ(f32_bits(f16_to_f32(0xfc00)), 0xff800000u);
  EXPECT_EQ(f32_bits(f16_to_f32(0x7e00)), 0x7fc00000u);  // NaN: sign and payload kept
  EXPECT_EQ(f32_bits(f16_to_f32(0xfd01)), 0xffa02000u);
  EXPECT_EQ(f32_bits(bf16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(f32_bits(bf16_to_f32(0x0001)), 0x00010000u);  // an f32 subnormal
  EXPECT_EQ(f32_bits(bf16_to_f32(0xff81)), 0xff810000u);  // NaN: sign and payload kept
}

// Every non-NaN 16-bit value survives widening and narrowing unchanged.
TEST(HalfBits, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<uint16_t>(b);
    if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) {
      EXPECT_EQ(f32_to_f16(f16_to_f32(h)), h);
    }
    if ((h & 0x7f80u) != 0x7f80u || (h & 0x7fu) == 0) {
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(h)), h);
    }
  }
}

uint16_t eigen_bits(f16 h) {
  return Eigen::numext::bit_cast<uint16_t>(h);
}
uint16_t eigen_bits(bf16 h) {
  return Eigen::numext::bit_cast<uint16_t>(h);
}

TEST(HalfBits, WideningMatchesEigenOnEveryPattern) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<uint16_t>(b);
    EXPECT_EQ(f32_bits(f16_to_f32(h)),
              f32_bits(static_cast<float>(Eigen::numext::bit_cast<f16>(h))))
        << std::hex << b;
    EXPECT_EQ(f32_bits(bf16_to_f32(h)),
              f32_bits(static_cast<float>(Eigen::numext::bit_cast<bf16>(h))))
        << std::hex << b;
  }
}

// Every f32 exponent and sign with the low bits at and around both rounding points (bit 12
// for f16 normals, bit 15 for bf16) and the low halves of every f16 subnormal tie, plus a
// pseudo-random sweep of all bits.
TEST(HalfBits, NarrowingMatchesEigen) {
  std::vector<uint32_t> lows = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u,
                                0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x9000u, 0xffffu};
  std::vector<uint32_t> inputs;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : lows) inputs.push_back(hi << 16 | lo);
  uint64_t s = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < (1 << 20); ++i) {
    s = s * 6364136223846793005u + 1442695040888963407u;
    inputs.push_back(static_cast<uint32_t>(s >> 32));
  }
  int mismatches = 0;
  for (uint32_t u : inputs) {
    const float v = f32_from_bits(u);
    mismatches += f32_to_f16(v) != eigen_bits(f16(v));
    mismatches += f32_to_bf16(v) != eigen_bits(bf16(v));
    if (mismatches > 0 && mismatches < 4)
      ADD_FAILURE() << std::hex << u << ": f16 " << f32_to_f16(v) << " vs " << eigen_bits(f16(v))
                    << ", bf16 " << f32_to_bf16(v) << " vs " << eigen_bits(bf16(v));
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace qg
