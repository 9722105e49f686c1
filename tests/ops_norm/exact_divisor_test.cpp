// ExactDivisor (ops/common/exact_divisor.h): the bits of x / s for every x, checked at the
// quotients closest to a rounding midpoint that binary32 allows (where a one-multiply
// reciprocal gets it wrong), at random operands over the whole float range, and at the
// operands that must take the division (zeros, infinities, NaNs, subnormals, out of range).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/common/exact_divisor.h"

namespace qg {
namespace {

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// The inverse of an odd s modulo 2^64 (Newton's iteration on the 2-adic integers).
uint64_t odd_inverse(uint64_t s) {
  uint64_t inv = s;  // correct to 3 bits
  for (int i = 0; i < 5; ++i) inv *= 2 - s * inv;
  return inv;
}

struct HardCase {
  float x, s;
};

// Dividends x whose quotient by s = S * 2^-b (S odd with b bits, so s is in [0.5, 1)) lies
// next to a midpoint M = n * 2^-24 of [1, 2) (n odd in [2^24, 2^25)): x - s * M = t * 2^-(24+b)
// exactly, for small odd t, the closest a float quotient gets to a midpoint. With
// X * 2^j = S * n + t for an integer X < 2^24, x = X * 2^(j-24-b).
std::vector<HardCase> hard_cases(uint64_t S) {
  std::vector<HardCase> out;
  const uint64_t inv = odd_inverse(S);
  for (int64_t t : {-15, -7, -5, -3, -1, 1, 3, 5, 7, 15}) {
    for (int j = 1; j <= 26; ++j) {
      const uint64_t mod = uint64_t{1} << j;
      const uint64_t n0 = (static_cast<uint64_t>(-t) * inv) & (mod - 1);
      // The odd n in [2^24, 2^25) congruent to n0 modulo 2^j (n0 is odd: t and S are).
      uint64_t n = n0;
      if (n < (uint64_t{1} << 24)) n += ((((uint64_t{1} << 24) - n) + mod - 1) / mod) * mod;
      if (n >= (uint64_t{1} << 25)) continue;
      const int64_t numerator = static_cast<int64_t>(S * n) + t;
      if (numerator <= 0 || numerator % static_cast<int64_t>(mod) != 0) continue;
      const int64_t X = numerator / static_cast<int64_t>(mod);
      if (X >= (int64_t{1} << 24)) continue;
      const int b = 64 - __builtin_clzll(S);
      const float s = std::ldexp(static_cast<float>(S), -b);
      const float x = std::ldexp(static_cast<float>(X), j - 24 - b);
      out.push_back({x, s});
    }
  }
  return out;
}

void expect_exact(const ExactDivisor<float>& div, float x, float s) {
  ASSERT_EQ(bits(div(x)), bits(x / s))
      << "x = " << x << " (0x" << std::hex << bits(x) << "), s = " << s << " (0x" << bits(s) << ")";
}

TEST(ExactDivisor, QuotientsNextToMidpoints) {
  std::mt19937_64 rng(20261126);
  std::vector<uint64_t> significands = {1,        3,        5,        7,        0xFFFFFF,
                                        0xFFFFFD, 0x800001, 0xAAAAAB, 0xC00001, 0x955555,
                                        0xB504F3, 0xFFFF01, 0x80000F, 0x7FFFFF, 0x123457};
  for (int i = 0; i < 400; ++i) significands.push_back((rng() & 0xFFFFFF) | 1);
  int64_t cases = 0, near = 0, naive_wrong = 0;  // near: within 2^-20 ulp of the midpoint
  for (uint64_t S : significands) {
    for (const HardCase& h : hard_cases(S)) {
      // Spread over exponents and signs within the fast range, and over the divisor's scale.
      for (int shift : {-30, -7, 0, 5, 29}) {
        for (float sign : {1.0f, -1.0f}) {
          const float x = sign * std::ldexp(h.x, shift), s = std::ldexp(h.s, (shift / 3));
          const ExactDivisor<float> div(s);
          ASSERT_TRUE(div.fast && ExactDivisor<float>::in_fast_range(x));
          expect_exact(div, x, s);
          ++cases;
          if (bits(x * div.y) != bits(x / s)) ++naive_wrong;
        }
      }
      const double q = static_cast<double>(h.x) / h.s;
      const double ulp = std::ldexp(1.0, std::ilogb(q) - 23);
      const double off = std::fabs(q - (std::floor(q / ulp) + 0.5) * ulp) / ulp;
      if (off < 0x1p-20) ++near;
    }
  }
  // The generator must find its cases, they must be next to midpoints, and they must be
  // hard: a quotient from one multiply by RN(1/s) rounds some of them the wrong way.
  EXPECT_GT(cases, 20000);
  EXPECT_GT(near, 1000);
  EXPECT_GT(naive_wrong, 100);
}

TEST(ExactDivisor, RandomOperandsOverTheWholeRange) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-45, 45);
  for (int d = 0; d < 300; ++d) {
    float s = mantissa(rng) * std::ldexp(1.0f, exponent(rng));
    if (d % 2) s = -s;
    const ExactDivisor<float> div(s);
    for (int i = 0; i < 20000; ++i) {
      const float x = from_bits(static_cast<uint32_t>(rng()));  // any float, NaNs included
      expect_exact(div, x, s);
    }
  }
}

TEST(ExactDivisor, SpecialOperandsTakeTheDivision) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f,     -0.0f,    inf,     -inf,    nan,      1e-45f, -1e-40f,
                            1e-38f,   0x1p-41f, 0x1p41f, 3.0e38f, -3.4e38f, 1.0f,   -0.75f,
                            0x1p-40f, 0x1p40f,  7.0f,    1e-20f,  1e20f};
  for (float s : specials) {
    const ExactDivisor<float> div(s);
    for (float x : specials) expect_exact(div, x, s);
  }
  EXPECT_FALSE(ExactDivisor<float>(0.0f).fast);
  EXPECT_FALSE(ExactDivisor<float>(1e-20f).fast);
  EXPECT_FALSE(ExactDivisor<float>(nan).fast);
  EXPECT_TRUE(ExactDivisor<float>(-3.0f).fast);
}

TEST(ExactDivisor, DoubleDivides) {
  const ExactDivisor<double> div(3.0);
  EXPECT_EQ(div(1.0), 1.0 / 3.0);
  EXPECT_EQ(div(-2.5), -2.5 / 3.0);
}

}  // namespace
}  // namespace qg
