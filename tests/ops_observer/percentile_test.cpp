// percentile_observer: hand-checked percentiles, histogram growth and attribute checks.
#include <cmath>

#include "tests/ops_observer/observer_harness.h"

namespace qg {
namespace {

using testing::expect_build_error;
using testing::ObserverHarness;

std::vector<double> ramp(double from, double to) {
  std::vector<double> v;
  for (double x = from; x <= to; x += 1) v.push_back(x);
  return v;
}

TEST(PercentileObserver, AffineInterpolatesInsideABin) {
  // 0..100 over 100 bins of width 1: bins 0..98 hold one value, bin 99 holds 99 and 100.
  // p = 90: q_hi = 90.9 -> bin 90 (90 before it) -> 90 + 0.9; q_lo = 10.1 -> 10 + 0.1.
  ObserverHarness h("percentile_observer", {101}, {{"percentile", 90.0}, {"bins", 100}});
  auto r = h.run(ramp(0, 100));
  EXPECT_FLOAT_EQ(static_cast<float>(r[2][0]), 10.1f);
  EXPECT_FLOAT_EQ(static_cast<float>(r[3][0]), 90.9f);
  // The range includes 0 for the qparams: scale = 90.9 / 255, zp 0.
  EXPECT_EQ(r[0][0], static_cast<double>(static_cast<float>(r[3][0]) / 255.0f));
  EXPECT_EQ(r[1][0], 0);
}

TEST(PercentileObserver, SymmetricUsesAbsoluteValues) {
  // |-50..50| over 50 bins of width 1; p = 100 reaches the right edge of the last bin.
  ObserverHarness h("percentile_observer", {101},
                    {{"percentile", 100.0}, {"bins", 50}, {"qscheme", "symmetric"}});
  auto r = h.run(ramp(-50, 50));
  EXPECT_EQ(r[2][0], -50);
  EXPECT_EQ(r[3][0], 50);
  EXPECT_EQ(r[0][0], static_cast<double>(50.0f / 127.5f));
  EXPECT_EQ(r[1][0], 128);
}

TEST(PercentileObserver, HundredIsTheBinnedHull) {
  // lo = -3, width 1 over 8 bins: -3 -> bin 0, 1 -> bin 4, 5 -> bin 8 clamped to 7.
  ObserverHarness h("percentile_observer", {3}, {{"percentile", 100.0}, {"bins", 8}});
  auto r = h.run({-3, 1, 5});
  EXPECT_EQ(r[2][0], -3);
  EXPECT_EQ(r[3][0], 5);
}

TEST(PercentileObserver, RangeGrowsByMergingBinPairs) {
  ObserverHarness h("percentile_observer", {101}, {{"bins", 100}});
  h.run(ramp(0, 100));
  EXPECT_EQ(h.state("lo"), std::vector<double>{0});
  EXPECT_EQ(h.state("width"), std::vector<double>{1});
  // [-50, 150] needs width 2 and m = ceil(50 / 2) = 25 new bins on the left: old bin i
  // moves to 25 + i / 2.
  std::vector<double> b2(101, 10.0);
  b2[0] = -50;
  b2[1] = 150;
  h.run(b2);
  EXPECT_EQ(h.state("lo"), std::vector<double>{-50});
  EXPECT_EQ(h.state("width"), std::vector<double>{2});
  auto counts = h.state("histogram");
  double total = 0;
  for (double c : counts) total += c;
  EXPECT_EQ(total, 202);
  EXPECT_EQ(counts[0], 1);        // -50
  EXPECT_EQ(counts[25], 2);       // old bins 0, 1
  EXPECT_EQ(counts[74], 3);       // old bins 98 (98) and 99 (99, 100)
  EXPECT_EQ(counts[30], 2 + 99);  // old bins 10, 11 plus 99 new values of 10
  EXPECT_EQ(counts[99], 1);       // 150 falls on the top edge
}

TEST(PercentileObserver, CountsSurviveEvalAndDisabledRuns) {
  ObserverHarness h("percentile_observer", {3}, {{"bins", 4}});
  h.run({1, 2, 3});
  auto before = h.state("histogram");
  h.run({-9, 9, 9}, /*training=*/false);
  h.set_enabled(false);
  h.run({-9, 9, 9});
  EXPECT_EQ(h.state("histogram"), before);
}

TEST(PercentileObserver, RejectsBadPercentileAndBins) {
  for (double p : {0.0, -1.0, 100.5, static_cast<double>(NAN)})
    expect_build_error("percentile_observer", {4}, {{"percentile", p}}, {"percentile"});
  for (int64_t b : {int64_t{0}, int64_t{-4}, int64_t{1}})
    expect_build_error("percentile_observer", {4}, {{"bins", b}}, {"bins", std::to_string(b)});
}

}  // namespace
}  // namespace qg
