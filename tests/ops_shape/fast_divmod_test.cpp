// FastDivmod (ops/common/fast_divmod.h), the invariant-divisor division of the CUDA gather
// index arithmetic: n / d for every divisor kind (1, powers of two and their neighbours,
// small, random up to 2^31 - 1) at the dividends where a multiply-high method goes wrong
// first (multiples of d and their neighbours, the top of the range) and at random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ops/common/fast_divmod.h"

namespace qg {
namespace {

TEST(FastDivmod, EqualsIntegerDivisionBelow2To31) {
  std::mt19937_64 rng(11);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d < 1500; ++d) divisors.push_back(d);
  for (int b = 1; b < 31; ++b)
    for (int64_t e : {-1, 0, 1}) divisors.push_back(static_cast<uint32_t>((int64_t{1} << b) + e));
  for (int i = 0; i < 500; ++i) divisors.push_back(1 + static_cast<uint32_t>(rng() % 0x7fffffffu));
  int64_t checked = 0;
  for (uint32_t d : divisors) {
    const FastDivmod f(d);
    auto check = [&](int64_t n) {
      if (n < 0 || n > 0x7fffffff) return;
      const auto u = static_cast<uint32_t>(n);
      ASSERT_EQ(f.div(u), u / d) << "n = " << u << ", d = " << d;
      ++checked;
    };
    for (int64_t n = 0; n < 300; ++n) check(n);
    for (int64_t k = 1; k < 40; ++k)
      for (int64_t e = -1; e <= 1; ++e) check(int64_t{d} * k + e);
    const int64_t top = int64_t{0x7fffffff} / d * d;
    for (int64_t e = -1; e <= 1; ++e) check(top + e);
    check(0x7fffffff);
    for (int i = 0; i < 300; ++i) check(static_cast<int64_t>(rng() % 0x80000000u));
  }
  EXPECT_GT(checked, 1000000);
}

}  // namespace
}  // namespace qg
