// moving_average_observer: hand-checked multi-batch sequences, per tensor and per channel.
#include <cmath>

#include "tests/ops_observer/observer_harness.h"

namespace qg {
namespace {

using testing::expect_build_error;
using testing::ObserverHarness;

TEST(MovingAverageObserver, HandCheckedSequence) {
  ObserverHarness h("moving_average_observer", {3}, {{"averaging_constant", 0.5}});
  h.run({1, -2, 3});
  EXPECT_EQ(h.state("min"), std::vector<double>{-2});
  EXPECT_EQ(h.state("max"), std::vector<double>{3});
  // min = -2 + 0.5 * (-4 - -2) = -3, max = 3 + 0.5 * (5 - 3) = 4.
  auto r = h.run({-4, 5, 0});
  EXPECT_EQ(h.state("min"), std::vector<double>{-3});
  EXPECT_EQ(h.state("max"), std::vector<double>{4});
  // u8 affine: scale = 7 / 255; zp = 0 - rint(-3 / scale) = rint(109.29) = 109.
  EXPECT_EQ(r[0][0], static_cast<double>(7.0f / 255.0f));
  EXPECT_EQ(r[1][0], 109);
  // A batch equal to the running range leaves it unchanged.
  h.run({-3, 4, 4});
  EXPECT_EQ(h.state("min"), std::vector<double>{-3});
  EXPECT_EQ(h.state("max"), std::vector<double>{4});
}

// Delayed mode: the outputs are the previous step's qparams while the state still updates.
TEST(MovingAverageObserver, DelayedOutputsThePreviousQparams) {
  Attrs a = {{"averaging_constant", 0.5}};
  ObserverHarness now("moving_average_observer", {3}, a);
  a.set("delayed", true);
  ObserverHarness late("moving_average_observer", {3}, a);
  // First batch: nothing observed before it, so (scale 1, zero point 0).
  auto r = late.run({1, -2, 3});
  EXPECT_EQ(r[0][0], 1.0);
  EXPECT_EQ(r[1][0], 0);
  auto first = now.run({1, -2, 3});
  // Second batch: the qparams of [-2, 3], while the state moves to [-3, 4] as usual.
  r = late.run({-4, 5, 0});
  now.run({-4, 5, 0});
  EXPECT_EQ(r, first);
  EXPECT_EQ(late.state("min"), std::vector<double>{-3});
  EXPECT_EQ(late.state("max"), std::vector<double>{4});
  // Evaluation (no update): delayed or not, the qparams of the current state.
  EXPECT_EQ(late.run({9, 9, 9}, false), now.run({9, 9, 9}, false));
}

TEST(MinMaxObserverDelayed, OutputsThePreviousRange) {
  ObserverHarness now("minmax_observer", {2});
  ObserverHarness late("minmax_observer", {2}, {{"delayed", true}});
  auto first = now.run({-1, 2});
  auto r = late.run({-1, 2});
  EXPECT_EQ(r[0][0], 1.0);  // no finite value seen before: (1, 0)
  EXPECT_EQ(r[1][0], 0);
  EXPECT_EQ(late.run({-5, 7}), first);
  EXPECT_EQ(late.state("min"), std::vector<double>{-5});
}

TEST(MovingAverageObserver, DefaultConstantRoundsInF32) {
  ObserverHarness h("moving_average_observer", {2});
  h.run({-2, 3});
  h.run({-4, 13});
  // -2 + 0.01f * -2 = -2.01999999955 -> f32 -2.02f; 3 + 0.01f * 10 = 3.0999999978 -> 3.1f.
  EXPECT_EQ(h.state("min"), std::vector<double>{static_cast<double>(-2.02f)});
  EXPECT_EQ(h.state("max"), std::vector<double>{static_cast<double>(3.1f)});
}

TEST(MovingAverageObserver, ConstantOneTracksTheLastBatch) {
  ObserverHarness h("moving_average_observer", {2}, {{"averaging_constant", 1.0}});
  h.run({-2, 3});
  h.run({-0.5, 0.25});
  EXPECT_EQ(h.state("min"), std::vector<double>{-0.5});
  EXPECT_EQ(h.state("max"), std::vector<double>{0.25});
}

TEST(MovingAverageObserver, ExplicitInitializedFlagNotAZeroSentinel) {
  ObserverHarness h("moving_average_observer", {2}, {{"averaging_constant", 0.5}});
  EXPECT_EQ(h.state("initialized"), std::vector<double>{0});
  h.run({0, 0});  // a genuine all-zero batch initialises to (0, 0)
  EXPECT_EQ(h.state("initialized"), std::vector<double>{1});
  h.run({-1, 1});  // moves from 0 instead of re-initialising to (-1, 1)
  EXPECT_EQ(h.state("min"), std::vector<double>{-0.5});
  EXPECT_EQ(h.state("max"), std::vector<double>{0.5});
}

TEST(MovingAverageObserver, PerChannelHandChecked) {
  // x [2, 2] on axis 0: channel 0 = row 0, channel 1 = row 1.
  ObserverHarness h("moving_average_observer", {2, 2},
                    {{"scope", "channel"}, {"axis", 0}, {"averaging_constant", 0.5}});
  h.run({1, -1, 2, 4});
  auto r = h.run({3, -3, 0, 8});
  EXPECT_EQ(h.state("min"), (std::vector<double>{-2, 1}));
  EXPECT_EQ(h.state("max"), (std::vector<double>{2, 6}));
  // channel 1: range [min(1, 0), 6] -> scale 6 / 255, zp 0.
  EXPECT_EQ(r[0][1], static_cast<double>(6.0f / 255.0f));
  EXPECT_EQ(r[1][1], 0);
  // A channel with no finite value in a batch keeps its statistics.
  h.run({NAN, INFINITY, 0, 4});
  EXPECT_EQ(h.state("min"), (std::vector<double>{-2, 0.5}));
  EXPECT_EQ(h.state("max"), (std::vector<double>{2, 5}));
  EXPECT_EQ(h.state("nonfinite_count"), std::vector<double>{2});
}

TEST(MovingAverageObserver, PerChannelUninitialisedChannelGivesDefaults) {
  ObserverHarness h("moving_average_observer", {2, 2}, {{"scope", "channel"}, {"axis", -1}});
  auto r = h.run({NAN, 1, NAN, 3});  // channel 0 sees only NaN
  EXPECT_EQ(r[0][0], 1.0);
  EXPECT_EQ(r[1][0], 0);
  EXPECT_EQ(r[0][1], static_cast<double>(3.0f / 255.0f));
  EXPECT_EQ(h.state("initialized"), (std::vector<double>{0, 1}));
}

TEST(MovingAverageObserver, RejectsAveragingConstantOutsideZeroOne) {
  for (double c : {0.0, -0.5, 1.5, static_cast<double>(NAN)})
    expect_build_error("moving_average_observer", {4}, {{"averaging_constant", c}},
                       {"averaging_constant"});
}

}  // namespace
}  // namespace qg
