// Behaviour every observer shares, checked for each op: the update gate (training mode and
// observer_enabled), non-finite values skipped and counted, the uninitialised (1, 0),
// empty tensors, per-channel on a negative axis agreeing with per-tensor on each channel,
// and the attribute checks.
#include <cmath>

#include "tests/ops_observer/observer_harness.h"

namespace qg {
namespace {

using testing::expect_build_error;
using testing::ObserverHarness;

class AnyObserver : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Observers, AnyObserver,
                         ::testing::Values("minmax_observer", "moving_average_observer",
                                           "percentile_observer", "histogram_observer"));

const std::vector<double> kBatch = {-1.5, 0.25, 3.0, 2.0, -0.5, 1.0};

TEST_P(AnyObserver, EvalModeDoesNotUpdate) {
  ObserverHarness h(GetParam(), {6});
  auto r = h.run(kBatch, /*training=*/false);
  EXPECT_EQ(r[0], std::vector<double>{1.0});
  EXPECT_EQ(r[1], std::vector<double>{0.0});
  auto trained = h.run(kBatch);
  EXPECT_NE(trained[0][0], 1.0);
  auto again = h.run({100, -100, 5, 5, 5, 5}, /*training=*/false);
  EXPECT_EQ(again[0], trained[0]);
  EXPECT_EQ(again[1], trained[1]);
}

TEST_P(AnyObserver, DisabledFlagDoesNotUpdate) {
  ObserverHarness h(GetParam(), {6});
  h.set_enabled(false);
  auto r = h.run(kBatch);
  EXPECT_EQ(r[0], std::vector<double>{1.0});
  EXPECT_EQ(r[1], std::vector<double>{0.0});
  h.set_enabled(true);
  EXPECT_NE(h.run(kBatch)[0][0], 1.0);
}

TEST_P(AnyObserver, NonFiniteSkippedAndCounted) {
  ObserverHarness dirty(GetParam(), {9});
  ObserverHarness clean(GetParam(), {6});
  auto d = dirty.run({NAN, -1.5, 0.25, INFINITY, 3.0, 2.0, -INFINITY, -0.5, 1.0});
  auto c = clean.run(kBatch);
  EXPECT_EQ(d, c);
  EXPECT_EQ(dirty.state("nonfinite_count"), std::vector<double>{3});
  EXPECT_EQ(clean.state("nonfinite_count"), std::vector<double>{0});
}

TEST_P(AnyObserver, AllNonFiniteLeavesItUninitialised) {
  ObserverHarness h(GetParam(), {3});
  auto r = h.run({NAN, INFINITY, -INFINITY});
  EXPECT_EQ(r[0], std::vector<double>{1.0});
  EXPECT_EQ(r[1], std::vector<double>{0.0});
  EXPECT_EQ(h.state("nonfinite_count"), std::vector<double>{3});
}

TEST_P(AnyObserver, EmptyTensorFlowsThroughUnchanged) {
  ObserverHarness h(GetParam(), {0, 3}, {{"scope", "channel"}, {"axis", -1}});
  auto r = h.run({});
  EXPECT_EQ(r[0], std::vector<double>(3, 1.0));
  EXPECT_EQ(r[1], std::vector<double>(3, 0.0));
  EXPECT_EQ(h.state("nonfinite_count"), std::vector<double>{0});
  ObserverHarness t(GetParam(), {0});
  EXPECT_EQ(t.run({})[0], std::vector<double>{1.0});
}

TEST_P(AnyObserver, PerChannelNegativeAxisMatchesPerTensorPerChannel) {
  // x [2, 3, 2], axis -2: channel c holds x[:, c, :].
  const std::vector<double> b1 = {1, -2, 3, 4, -5, 6, 0.5, 7, -8, 9, 10, -11};
  const std::vector<double> b2 = {2, 2, -1, 40, 5, -6, 1.5, 0, 8, 19, -10, 11};
  for (const char* scheme : {"affine", "symmetric"}) {
    Attrs pc = {{"scope", "channel"}, {"axis", -2}, {"qscheme", scheme}};
    ObserverHarness h(GetParam(), {2, 3, 2}, pc);
    h.run(b1);
    auto r = h.run(b2);
    for (int c = 0; c < 3; ++c) {
      ObserverHarness one(GetParam(), {4}, {{"qscheme", scheme}});
      auto pick = [&](const std::vector<double>& b) {
        return std::vector<double>{b[2 * c], b[2 * c + 1], b[6 + 2 * c], b[6 + 2 * c + 1]};
      };
      one.run(pick(b1));
      auto o = one.run(pick(b2));
      for (size_t k = 0; k < r.size(); ++k) EXPECT_EQ(r[k][c], o[k][0]) << scheme << " c" << c;
    }
  }
}

TEST_P(AnyObserver, RejectsBadAttributesAndInput) {
  const std::string op = GetParam();
  expect_build_error(op, {2, 3}, {{"scope", "channel"}, {"axis", 2}}, {"axis", "2"});
  expect_build_error(op, {2, 3}, {{"scope", "channel"}, {"axis", -3}}, {"axis", "-3"});
  expect_build_error(op, {4}, {{"bits", 1}}, {"bits", "1"});
  expect_build_error(op, {4}, {{"bits", 17}}, {"bits", "17"});
  expect_build_error(op, {4}, {{"quant_min", 5}, {"quant_max", 5}}, {"quant_min", "5"});
  expect_build_error(op, {4}, {{"quant_min", 9}, {"quant_max", 2}}, {"quant_min", "9"});
  expect_build_error(op, {4}, {{"eps", 0.0}}, {"eps"});
  if (op == "minmax_observer" || op == "moving_average_observer") {
    // Token and group scopes exist for the min/max observers; their shapes are checked.
    expect_build_error(op, {4, 6}, {{"scope", "group"}, {"group_size", 0}}, {"group_size", "0"});
    expect_build_error(op, {}, {{"scope", "token"}}, {"token"});
  } else {
    expect_build_error(op, {4}, {{"scope", "token"}}, {"scope", "token"});
  }
  expect_build_error(op, {4}, {}, {"i32"}, DType::i32);
}

// Per-token and per-group running ranges, checked by hand: x = [[1, -2, 3, 0], [5, 6, -1, 2]].
TEST(MinMaxObserverScopes, TokenAndGroupKeepOneRangePerRow) {
  const std::vector<double> x = {1, -2, 3, 0, 5, 6, -1, 2};
  ObserverHarness token("minmax_observer", {2, 4}, {{"scope", "token"}});
  token.run(x);
  EXPECT_EQ(token.state("min"), (std::vector<double>{-2, -1}));
  EXPECT_EQ(token.state("max"), (std::vector<double>{3, 6}));
  ObserverHarness group("minmax_observer", {2, 4},
                        {{"scope", "group"}, {"axis", -1}, {"group_size", 2}});
  group.run(x);
  // Groups of two along the last axis: {1, -2}, {3, 0}, {5, 6}, {-1, 2}.
  EXPECT_EQ(group.state("min"), (std::vector<double>{-2, 0, 5, -1}));
  EXPECT_EQ(group.state("max"), (std::vector<double>{1, 3, 6, 2}));
}

TEST_P(AnyObserver, InputDtypesAgreeInF32Range) {
  // f64, f16 and bf16 inputs are observed after a cast to f32; values exact in every dtype.
  const std::vector<double> b = {-2, 0.5, 1.25, 3, -0.75, 1};
  ObserverHarness ref(GetParam(), {6});
  auto want = ref.run(b);
  for (DType d : {DType::f64, DType::f16, DType::bf16}) {
    ObserverHarness h(GetParam(), {6}, {}, d);
    EXPECT_EQ(h.run(b), want) << dtype_name(d);
  }
}

}  // namespace
}  // namespace qg
