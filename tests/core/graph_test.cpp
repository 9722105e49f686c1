#include <gtest/gtest.h>

#include <algorithm>

#include "core/graph.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

TEST(Graph, UnknownOp) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error([&] { g.apply("frobnicate", {x}); }, {"unknown op 'frobnicate'"});
}

TEST(Graph, UnknownAttributeNamesOpAndValue) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error(
      [&] {
        g.apply("sum", {x}, {{"axis_typo", 3}});
      },
      {"[sum]", "unknown attribute 'axis_typo' = 3", "known: axes, keepdim"});
}

TEST(Graph, AttributeTypeMismatch) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error(
      [&] {
        g.apply("sum", {x}, {{"keepdim", "yes"}});
      },
      {"[sum]", "'keepdim' must be bool", "\"yes\""});
}

TEST(Graph, MissingRequiredAttribute) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error([&] { g.apply("reshape", {x}); }, {"[reshape]", "required attribute 'shape'"});
}

TEST(Graph, ArityMismatch) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error([&] { g.apply("add", {x}); }, {"[add]", "expects 2 inputs, got 1"});
}

TEST(Graph, ShapeMismatch) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2, 3}});
  ValueId b = g.input("b", {DType::f32, {4}});
  expect_error([&] { g.apply("add", {a, b}); }, {"[add]", "[2, 3]", "[4]", "broadcast"});
  ValueId m = g.input("m", {DType::f32, {3, 5}});
  expect_error([&] { g.apply("matmul", {m, a}); }, {"[matmul]", "inner dimensions differ"});
}

TEST(Graph, DtypeMismatch) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}});
  ValueId b = g.input("b", {DType::f64, {2}});
  expect_error([&] { g.apply("mul", {a, b}); }, {"[mul]", "dtype mismatch", "f32[2]", "f64[2]"});
}

TEST(Graph, IntegerInputToFloatOp) {
  Graph g;
  ValueId a = g.input("a", {DType::i32, {2}});
  expect_error([&] { g.apply("relu", {a}); }, {"[relu]", "floating point", "i32[2]"});
}

TEST(Graph, UndefinedValue) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  expect_error([&] { g.apply("add", {x, 999}); }, {"[add]", "value 999", "not defined"});
}

TEST(Graph, DanglingInputAfterRemoval) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId y = g.apply1("relu", {x});
  ValueId z = g.apply1("neg", {x});
  ValueId w = g.apply1("add", {z, x});
  // Rewire w to read y, remove neg (no readers left), then point w back at neg's output.
  g.replace_input(g.value(w).producer, 0, y);
  g.remove_node(g.value(z).producer);
  g.replace_input(g.value(w).producer, 0, z);
  expect_error([&] { g.topological_order(); }, {"dangling input"});
}

TEST(Graph, RemovingANodeWithReadersIsRefused) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId y = g.apply1("relu", {x});
  g.apply1("neg", {y});
  expect_error([&] { g.remove_node(g.value(y).producer); }, {"cannot remove", "is read by"});
}

TEST(Graph, CycleIsReportedWithItsNodes) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId a = g.apply1("relu", {x}, {}, "first");
  ValueId b = g.apply1("neg", {a}, {}, "second");
  g.replace_input(g.value(a).producer, 0, b);  // first reads second, second reads first
  expect_error([&] { g.topological_order(); }, {"cycle", "first", "second"});
}

TEST(Graph, TopologicalOrderRespectsDependencies) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId a = g.apply1("relu", {x});
  ValueId b = g.apply1("neg", {x});
  ValueId c = g.apply1("add", {a, b});
  auto order = g.topological_order();
  auto pos = [&](ValueId v) {
    return std::find(order.begin(), order.end(), g.value(v).producer) - order.begin();
  };
  EXPECT_LT(pos(x), pos(a));
  EXPECT_LT(pos(a), pos(c));
  EXPECT_LT(pos(b), pos(c));
  EXPECT_EQ(boost::num_edges(g.boost_graph()), 4u);
}

TEST(Graph, ControlDependencyOrdersNodes) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId a = g.apply1("relu", {x});
  ValueId b = g.apply1("neg", {x});
  g.add_control_dependency(g.value(a).producer, g.value(b).producer);
  auto order = g.topological_order();
  auto ia = std::find(order.begin(), order.end(), g.value(a).producer);
  auto ib = std::find(order.begin(), order.end(), g.value(b).producer);
  EXPECT_LT(ia, ib);
}

// An asynchronous node (all_reduce, OpDef::overlaps_async) is issued as soon as its input
// exists and its readers run after everything that does not need it: here the reduced bucket's
// reader waits behind the rest of the "backward" chain, whichever order Boost's sort picked.
TEST(Graph, AsynchronousNodesOverlapTheWorkThatDoesNotNeedThem) {
  for (bool reader_first : {true, false}) {
    Graph g;
    ValueId x = g.input("x", {DType::f32, {4}});
    ValueId a1 = g.apply1("relu", {x});
    ValueId r = kNoValue, wait = kNoValue;
    if (reader_first) {  // built (and numbered) before the rest of the chain
      r = g.apply1("all_reduce", {a1}, {{"op", std::string("avg")}});
      wait = g.apply1("neg", {r});
    }
    ValueId a2 = g.apply1("relu", {a1});
    ValueId a3 = g.apply1("relu", {a2});
    if (!reader_first) {
      r = g.apply1("all_reduce", {a1}, {{"op", std::string("avg")}});
      wait = g.apply1("neg", {r});
    }
    ValueId last = g.apply1("add", {a3, wait});
    g.mark_output(last);
    const auto order = g.topological_order();
    auto pos = [&](ValueId v) {
      return std::find(order.begin(), order.end(), g.value(v).producer) - order.begin();
    };
    SCOPED_TRACE(reader_first ? "reader built first" : "reader built last");
    EXPECT_EQ(pos(r), pos(a1) + 1);  // issued right after its input
    EXPECT_GT(pos(wait), pos(a3));   // its reader after the independent work
    EXPECT_LT(pos(wait), pos(last));
  }
}

// Readers of reduced buckets run in the order their collectives were issued: the reader of the
// bucket reduced last (the embedding's, at the end of the backward) must not hold the stream
// while the readers of earlier buckets could run; whichever reader was built first.
TEST(Graph, ReadersOfEarlierCollectivesRunFirst) {
  for (bool late_reader_first : {true, false}) {
    Graph g;
    ValueId x = g.input("x", {DType::f32, {4}});
    ValueId a1 = g.apply1("relu", {x});
    ValueId r1 = g.apply1("all_reduce", {a1}, {{"op", std::string("avg")}});
    ValueId a2 = g.apply1("relu", {a1});
    ValueId a3 = g.apply1("relu", {a2});
    ValueId r2 = g.apply1("all_reduce", {a3}, {{"op", std::string("avg")}});
    ValueId w1 = kNoValue, w2 = kNoValue;
    if (late_reader_first) {
      w2 = g.apply1("neg", {r2});
      w1 = g.apply1("neg", {r1});
    } else {
      w1 = g.apply1("neg", {r1});
      w2 = g.apply1("neg", {r2});
    }
    ValueId w1b = g.apply1("relu", {w1});  // a second reader of the early bucket's chain
    g.mark_output(g.apply1("add", {w1b, w2}));
    const auto order = g.topological_order();
    auto pos = [&](ValueId v) {
      return std::find(order.begin(), order.end(), g.value(v).producer) - order.begin();
    };
    SCOPED_TRACE(late_reader_first ? "late reader built first" : "early reader built first");
    EXPECT_LT(pos(r1), pos(a2));  // the first collective right after its input
    EXPECT_LT(pos(r2), pos(w1));  // both issued before any reader
    EXPECT_LT(pos(w1), pos(w2));  // the early bucket's readers first
    EXPECT_LT(pos(w1b), pos(w2));
  }
}

// The nodes that only feed a collective (a bucket's packing, the cast of a gradient into it)
// run as soon as they are ready, so the collective is issued as soon as its last gradient
// exists rather than when the packing's place in Boost's order comes: here the packing of the
// first bucket is built (and numbered) after a long chain it does not need.
TEST(Graph, WorkThatOnlyFeedsACollectiveRunsAsSoonAsReady) {
  for (bool pack_first : {true, false}) {
    Graph g;
    ValueId x = g.input("x", {DType::f32, {4}});
    ValueId grad = g.apply1("relu", {x});
    ValueId pack = kNoValue, r = kNoValue;
    auto make_pack = [&] {
      pack = g.apply1("neg", {grad});  // the gradient's way into its bucket
      r = g.apply1("all_reduce", {g.apply1("relu", {pack})}, {{"op", std::string("avg")}});
    };
    if (pack_first) make_pack();
    ValueId chain = grad;
    for (int i = 0; i < 6; ++i) chain = g.apply1("relu", {chain});
    if (!pack_first) make_pack();
    g.mark_output(g.apply1("add", {chain, r}));
    const auto order = g.topological_order();
    auto pos = [&](ValueId v) {
      return std::find(order.begin(), order.end(), g.value(v).producer) - order.begin();
    };
    SCOPED_TRACE(pack_first ? "packing built first" : "packing built last");
    EXPECT_EQ(pos(pack), pos(grad) + 1);  // packed right after the gradient
    EXPECT_EQ(pos(r), pos(pack) + 2);     // issued right after its packing
    EXPECT_LT(pos(r), pos(chain));        // before the independent work
  }
}

TEST(Graph, NamesAreUnique) {
  Graph g;
  g.input("x", {DType::f32, {2}});
  expect_error([&] { g.input("x", {DType::f32, {2}}); }, {"already used"});
  expect_error([&] { g.at("nope"); }, {"no value is named 'nope'"});
}

TEST(Graph, ParametersMustBeFloat) {
  Graph g;
  expect_error(
      [&] {
        g.parameter("w", Tensor::from_doubles({2}, {1, 2}, DType::i32));
      },
      {"[parameter]", "floating point", "i32"});
}

}  // namespace
}  // namespace qg
