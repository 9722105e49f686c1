#include <gtest/gtest.h>

#include "autograd/grad.h"
#include "runtime/executor.h"
#include "runtime/gradcheck.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

std::vector<double> run1(Graph& g, ValueId v, const Executor::Feeds& feeds) {
  Executor exec(g);
  return exec.run(feeds, {v})[0].to_doubles();
}

TEST(Autograd, FanOutContributionsAccumulate) {
  // y = sum(x * x + x): dy/dx = 2x + 1; x is read three times.
  Graph g;
  ValueId x = g.input("x", {DType::f64, {3}});
  ValueId y = g.apply1("sum", {g.apply1("add", {g.apply1("mul", {x, x}), x})});
  ValueId dx = grad(g, y, {x})[0];
  EXPECT_EQ(run1(g, dx, {{"x", Tensor::from_doubles({3}, {1, -2, 0.5}, DType::f64)}}),
            (std::vector<double>{3, -3, 2}));
}

TEST(Autograd, StopGradientBlocksFlow) {
  // y = sum(x * stop_gradient(x)): dy/dx = stop_gradient(x) = x (one path only).
  Graph g;
  ValueId x = g.input("x", {DType::f64, {2}});
  ValueId y = g.apply1("sum", {g.apply1("mul", {x, g.apply1("stop_gradient", {x})})});
  ValueId dx = grad(g, y, {x})[0];
  EXPECT_EQ(run1(g, dx, {{"x", Tensor::from_doubles({2}, {3, -1}, DType::f64)}}),
            (std::vector<double>{3, -1}));
}

TEST(Autograd, UnrelatedInputGetsZeros) {
  Graph g;
  ValueId x = g.input("x", {DType::f64, {2}});
  ValueId z = g.input("z", {DType::f64, {2}});
  ValueId y = g.apply1("sum", {x});
  ValueId dz = grad(g, y, {z})[0];
  EXPECT_EQ(run1(g, dz, {{"z", Tensor::from_doubles({2}, {3, -1}, DType::f64)}}),
            (std::vector<double>{0, 0}));
}

TEST(Autograd, NonDifferentiableInputsAndOps) {
  // Labels are not differentiable; the observer output carries no gradient to x, but the
  // fake_quantize STE path does.
  Graph g;
  ValueId x = g.input("x", {DType::f64, {2, 3}});
  ValueId labels = g.input("labels", {DType::i64, {2}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  ValueId loss = g.apply1("softmax_cross_entropy", {fq[0], labels});
  ValueId dx = grad(g, loss, {x})[0];
  EXPECT_EQ(g.value(dx).type, (TensorType{DType::f64, {2, 3}}));
  expect_error([&] { grad(g, loss, {labels}); }, {"cannot differentiate", "i64"});
  expect_error([&] { grad(g, labels, {x}); }, {"loss must be floating point"});
}

TEST(Autograd, MatmulChainMatchesHandDerivation) {
  // loss = sum(relu(x @ w)); x [1,2], w [2,2].
  Graph g;
  ValueId x = g.input("x", {DType::f64, {1, 2}});
  ValueId w = g.parameter("w", Tensor::from_doubles({2, 2}, {1, -1, 2, 1}, DType::f64));
  ValueId loss = g.apply1("sum", {g.apply1("relu", {g.apply1("matmul", {x, w})})});
  auto grads = grad(g, loss, {x, w});
  Executor exec(g);
  auto out = exec.run({{"x", Tensor::from_doubles({1, 2}, {1, 1}, DType::f64)}}, grads);
  // x @ w = [3, 0]: relu passes column 0 only (0 is not > 0).
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{1, 2}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 0, 1, 0}));
}

// Ops registered by tests carry this prefix so the all-ops check can leave them out.
const char* kTestOpPrefix = "test_";

TEST(Gradcheck, DetectsAWrongBackwardRule) {
  // neg with a deliberately wrong rule (dx = dy instead of -dy) must fail the check.
  OpRegistry& registry = OpRegistry::instance();
  if (registry.find("test_wrong_neg") == nullptr) {
    OpDef& bad = registry.define("test_wrong_neg");
    const OpDef& neg = registry.get("neg");
    std::string name = bad.name;
    bad = neg;
    bad.name = name;
    bad.backward = [](BackwardContext& c) -> std::vector<ValueId> { return {c.grad_or_zeros(0)}; };
  }
  const OpDef& bad = registry.get("test_wrong_neg");
  GradcheckResult r = gradcheck(bad, bad.gradcheck_samples().at(0));
  EXPECT_FALSE(r.passed);
  EXPECT_GT(r.max_rel_error, 1.0);
}

TEST(Gradcheck, EveryRegisteredOpPasses) {
  for (const auto& r : gradcheck_all()) {
    if (r.op.rfind(kTestOpPrefix, 0) == 0) continue;
    EXPECT_TRUE(r.passed) << r.op << " " << r.sample << " " << r.error;
  }
}

TEST(Registry, SelfCheckCatchesMissingBackward) {
  OpRegistry r;
  OpDef& op = r.define("broken");
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& c) { return std::vector<TensorType>{c.inputs[0]}; };
  op.kernels.push_back({DeviceType::cpu, {}, [](KernelContext&) {}});
  expect_error([&] { r.self_check(); }, {"broken", "no backward rule", "no gradient-check sample"});
  expect_error([&] { r.define("broken"); }, {"defined twice"});
}

}  // namespace
}  // namespace qg
