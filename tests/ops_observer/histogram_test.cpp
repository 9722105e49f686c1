// histogram_observer: PyTorch HistogramObserver's binning, merging and restart rules,
// checked by hand on tiny histograms, and its attribute checks.
#include <cmath>

#include "tests/ops_observer/observer_harness.h"

namespace qg {
namespace {

using testing::expect_build_error;
using testing::ObserverHarness;

TEST(HistogramObserver, MergesByUpsamplingTheOldHistogram) {
  Attrs a = {{"bins", 4}, {"upsample_rate", 2}};
  ObserverHarness h("histogram_observer", {4}, a);
  // histc over [0, 3]: bin = int(v * 4 / 3): 0, 1, 2, 3.
  h.run({0, 1, 2, 3});
  EXPECT_EQ(h.state("histogram"), (std::vector<double>{1, 1, 1, 1}));
  // 6 widens the range to [0, 6]: cell = 3 / 8, downsample = ceil(6 / 1.5) = 4, start 0.
  // The old bins, each repeated twice, fill cells 0..7; new bin j sums cells 4j..4j+3
  // and divides by 2: [2, 2, 0, 0]; the 6 itself lands in bin 3.
  h.run({6, 6, 6, 6});
  EXPECT_EQ(h.state("histogram"), (std::vector<double>{2, 2, 0, 4}));
  EXPECT_EQ(h.state("min"), std::vector<double>{0});
  EXPECT_EQ(h.state("max"), std::vector<double>{6});
}

TEST(HistogramObserver, SameRangeAddsCounts) {
  ObserverHarness h("histogram_observer", {4}, {{"bins", 4}});
  h.run({0, 1, 2, 3});
  h.run({3, 3, 0, 1});
  EXPECT_EQ(h.state("histogram"), (std::vector<double>{2, 2, 1, 3}));
}

TEST(HistogramObserver, DegenerateRangeRestartsFromTheNextBatch) {
  ObserverHarness h("histogram_observer", {3}, {{"bins", 4}});
  // min == max == 3: histc widens to [2, 4]; 3 lands in bin int(1 * 4 / 2) = 2.
  h.run({3, 3, 3});
  EXPECT_EQ(h.state("histogram"), (std::vector<double>{0, 0, 3, 0}));
  // PyTorch rebuilds from the new batch alone while min == max.
  h.run({1, 5, 5});
  EXPECT_EQ(h.state("histogram"), (std::vector<double>{1, 0, 0, 2}));
  EXPECT_EQ(h.state("min"), std::vector<double>{1});
  EXPECT_EQ(h.state("max"), std::vector<double>{5});
}

TEST(HistogramObserver, SearchTrimsTheSparseTopBinOfAUniformRamp) {
  // 10001 evenly spaced values in [0, 1] over 2048 bins: the L2 search drops the last bin,
  // giving [0, 2047 / 2048] (PyTorch 1.13 picks the same range).
  std::vector<double> x;
  for (int i = 0; i <= 10000; ++i) x.push_back(static_cast<float>(i / 10000.0));
  ObserverHarness h("histogram_observer", {10001});
  auto r = h.run(x);
  EXPECT_EQ(r[2][0], 0.0);
  EXPECT_EQ(r[3][0], 2047.0 / 2048.0);
  EXPECT_EQ(r[0][0], static_cast<double>(static_cast<float>(2047.0 / 2048.0) / 255.0f));
}

TEST(HistogramObserver, SearchKeepsTheRangeInsideMinMax) {
  std::vector<double> x;
  for (int i = 0; i < 1000; ++i) x.push_back(std::sin(i * 0.37) * 2.0);
  x.push_back(40.0);
  ObserverHarness h("histogram_observer", {1001});
  auto r = h.run(x);
  EXPECT_GE(r[2][0], h.state("min")[0]);
  EXPECT_LE(r[3][0], h.state("max")[0]);
  EXPECT_LT(r[2][0], r[3][0]);
}

TEST(HistogramObserver, UninitialisedRangeIsZero) {
  ObserverHarness h("histogram_observer", {2});
  auto r = h.run({1, 2}, /*training=*/false);
  EXPECT_EQ(r[2][0], 0);
  EXPECT_EQ(r[3][0], 0);
}

TEST(HistogramObserver, RejectsBadBinsAndUpsampleRate) {
  for (int64_t b : {int64_t{0}, int64_t{-1}})
    expect_build_error("histogram_observer", {4}, {{"bins", b}}, {"bins", std::to_string(b)});
  expect_build_error("histogram_observer", {4}, {{"upsample_rate", 0}}, {"upsample_rate"});
}

}  // namespace
}  // namespace qg

namespace qg {
namespace {

TEST(HistogramObserver, UnrepresentableMergeGridFallsBackToBinCentres) {
  // A range of one subnormal makes PyTorch's merge cell 0; the old mass moves to the new
  // bin of its centre instead of dividing by zero.
  testing::ObserverHarness h("histogram_observer", {2}, {{"bins", 8}});
  h.run({0.0, 1e-44});
  h.run({1e30, 5e29});
  auto counts = h.state("histogram");
  EXPECT_EQ(counts[0], 2);  // the two tiny values
  EXPECT_EQ(counts[4], 1);  // 5e29
  EXPECT_EQ(counts[7], 1);  // 1e30
  EXPECT_EQ(h.state("min")[0], 0.0);
  EXPECT_EQ(h.state("max")[0], static_cast<double>(1e30f));
  // Huge finite values (the span 2e38 still fits in f32) give finite qparams.
  testing::ObserverHarness w("histogram_observer", {2});
  auto r = w.run({-1e38, 1e38});
  EXPECT_TRUE(std::isfinite(r[0][0]) && r[0][0] > 0);
}

}  // namespace
}  // namespace qg
