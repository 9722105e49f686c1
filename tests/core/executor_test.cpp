#include <gtest/gtest.h>

#include <cmath>

#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

TEST(Executor, FeedsByNameAndFetchesByName) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId b = g.input("b", {DType::f32, {3}});
  g.set_name(g.apply1("mul", {a, b}), "product");
  Executor exec(g);
  auto out = exec.run_named(
      {{"a", Tensor::from_doubles({3}, {1, 2, 3})}, {"b", Tensor::from_doubles({3}, {4, 5, 6})}},
      {"product"});
  EXPECT_EQ(out["product"].to_doubles(), (std::vector<double>{4, 10, 18}));
}

TEST(Executor, MissingGraphInput) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId b = g.input("b", {DType::f32, {3}});
  ValueId y = g.apply1("add", {a, b});
  Executor exec(g);
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f32)}}, {y});
      },
      {"missing graph input 'b'"});
}

TEST(Executor, FedTensorMustMatchDeclaration) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId y = g.apply1("relu", {a});
  Executor exec(g);
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({4}, DType::f32)}}, {y});
      },
      {"declared f32[3]", "fed f32[4]"});
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f64)}}, {y});
      },
      {"declared f32[3]", "fed f64[3]"});
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f32)}, {"zzz", Tensor()}}, {y});
      },
      {"feed 'zzz' does not name a graph input"});
}

TEST(Executor, OnlyNeededNodesRun) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}});
  ValueId unused = g.input("unused", {DType::f32, {2}});
  g.apply1("neg", {unused});
  ValueId y = g.apply1("neg", {a});
  Executor exec(g);
  EXPECT_EQ(exec.run({{"a", Tensor::from_doubles({2}, {1, -2})}}, {y})[0].to_doubles(),
            (std::vector<double>{-1, 2}));
}

TEST(Executor, EmptyTensorsFlowThrough) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {0, 3}});
  ValueId s = g.constant(Tensor::from_doubles({1}, {0.1}));
  ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
  auto fq = g.apply("fake_quantize", {g.apply1("relu", {a}), s, z});
  ValueId total = g.apply1("sum", {fq[0]});
  Executor exec(g);
  auto out = exec.run({{"a", Tensor::zeros({0, 3}, DType::f32)}}, {fq[0], fq[1], total});
  EXPECT_EQ(out[0].numel(), 0);
  EXPECT_EQ(out[1].numel(), 0);
  EXPECT_EQ(out[2].at(0), 0.0);
}

TEST(Executor, ObserverStatePersistsAcrossRunsAndFreezesInEval) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3}});
  auto qp = g.apply("minmax_observer", {x});
  Executor exec(g);
  NodeId obs = g.value(qp[0]).producer;
  exec.run({{"x", Tensor::from_doubles({3}, {-1, 0, 2})}}, {qp[0]});
  exec.run({{"x", Tensor::from_doubles({3}, {0, 3, 1})}}, {qp[0]});
  EXPECT_EQ(exec.state(obs, "min").at(0), -1.0);
  EXPECT_EQ(exec.state(obs, "max").at(0), 3.0);
  exec.set_training(false);
  exec.run({{"x", Tensor::from_doubles({3}, {-50, 0, 50})}}, {qp[0]});
  EXPECT_EQ(exec.state(obs, "max").at(0), 3.0);
  expect_error([&] { exec.state(obs, "nope"); }, {"no state named 'nope'"});
}

TEST(Executor, ParametersPersistAndAreAddressableByName) {
  Graph g;
  ValueId w = g.parameter("w", Tensor::from_doubles({2}, {1, 2}));
  ValueId y = g.apply1("neg", {w});
  Executor exec(g);
  exec.parameter("w").data<float>()[0] = 5;
  EXPECT_EQ(exec.run({}, {y})[0].to_doubles(), (std::vector<double>{-5, -2}));
  expect_error([&] { exec.parameter("y_missing"); }, {"no value is named"});
}

TEST(Executor, GraphGrowthAfterConstructionIsPickedUp) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}});
  Executor exec(g);
  ValueId y = g.apply1("neg", {a});
  EXPECT_EQ(exec.run({{"a", Tensor::from_doubles({2}, {1, 2})}}, {y})[0].to_doubles(),
            (std::vector<double>{-1, -2}));
}

}  // namespace
}  // namespace qg
