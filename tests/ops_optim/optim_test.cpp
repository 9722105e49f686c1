// The optimizer ops against hand-derived steps of the textbook formulas (PyTorch's
// torch.optim conventions) and against values printed by PyTorch 1.13, plus their
// bad-input errors and their ordering inside a training graph.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

// A graph `param -> opt(param, grad)` with the gradient fed as an input; step() runs one
// update with the given gradient and returns the parameter afterwards.
struct OneParam {
  Graph g;
  ValueId p, grad;
  NodeId step_node;
  std::unique_ptr<Executor> ex;
  OneParam(const std::string& op, const Tensor& init, const Attrs& attrs) {
    p = g.parameter("p", init);
    grad = g.input("g", {init.dtype(), init.shape()});
    g.apply(op, {p, grad}, attrs, "p." + op);
    step_node = g.num_nodes() - 1;
    ex = std::make_unique<Executor>(g);
  }
  std::vector<double> step(const std::vector<double>& gv) {
    const Tensor& cur = ex->parameter("p");
    ex->run({{"g", Tensor::from_doubles(cur.shape(), gv, cur.dtype())}}, {}, {step_node});
    return ex->parameter("p").to_doubles();
  }
};

TEST(Sgd, PlainStepIsPMinusLrG) {
  OneParam t("sgd", Tensor::from_doubles({2}, {1.0, -2.0}, DType::f64), {{"lr", 0.1}});
  EXPECT_EQ(t.step({0.5, 0.25}), (std::vector<double>{1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25}));
}

TEST(Sgd, MomentumBufferStartsAtFirstGradient) {
  // Step 1: buf = g; step 2: buf = 0.9 * buf + g (dampening 0).
  OneParam t("sgd", Tensor::from_doubles({2}, {1.0, -2.0}, DType::f64),
             {{"lr", 0.1}, {"momentum", 0.9}});
  std::vector<double> p1 = t.step({0.5, 0.25});
  EXPECT_DOUBLE_EQ(p1[0], 0.95);
  EXPECT_DOUBLE_EQ(p1[1], -2.025);
  std::vector<double> p2 = t.step({0.5, 0.25});
  EXPECT_DOUBLE_EQ(p2[0], 0.95 - 0.1 * 0.95);     // buf = 0.45 + 0.5
  EXPECT_DOUBLE_EQ(p2[1], -2.025 - 0.1 * 0.475);  // buf = 0.225 + 0.25
  EXPECT_EQ(t.ex->state(t.step_node, "step").at(0), 2);
  EXPECT_DOUBLE_EQ(t.ex->state(t.step_node, "momentum_buffer").at(0), 0.95);
}

TEST(Sgd, DampeningWeightDecayAndNesterov) {
  // Dampening applies from the second step: buf = 0.9 * 0.5 + (1 - 0.5) * 0.5 = 0.7.
  OneParam d("sgd", Tensor::from_doubles({1}, {1.0}, DType::f64),
             {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.5}});
  d.step({0.5});
  EXPECT_DOUBLE_EQ(d.step({0.5})[0], 0.95 - 0.1 * 0.7);
  // Weight decay: g = 0.5 + 0.1 * 1 = 0.6.
  OneParam w("sgd", Tensor::from_doubles({1}, {1.0}, DType::f64),
             {{"lr", 0.1}, {"weight_decay", 0.1}});
  EXPECT_DOUBLE_EQ(w.step({0.5})[0], 1.0 - 0.1 * 0.6);
  // Nesterov: buf = 0.5, g = 0.5 + 0.9 * 0.5 = 0.95.
  OneParam n("sgd", Tensor::from_doubles({1}, {1.0}, DType::f64),
             {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}});
  EXPECT_DOUBLE_EQ(n.step({0.5})[0], 1.0 - 0.1 * 0.95);
}

TEST(Adam, FirstStepMovesByLrTimesSign) {
  // t = 1: m = 0.1 g, v = 0.001 g^2, so m_hat / sqrt(v_hat) = sign(g) (up to eps).
  OneParam t("adam", Tensor::from_doubles({3}, {1.0, -2.0, 0.3}, DType::f64), {{"lr", 0.1}});
  std::vector<double> p = t.step({0.5, -0.25, 4.0});
  EXPECT_NEAR(p[0], 0.9, 1e-7);
  EXPECT_NEAR(p[1], -1.9, 1e-7);
  EXPECT_NEAR(p[2], 0.2, 1e-7);
}

TEST(Adam, TwoStepsFollowTheBiasCorrectedFormula) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  OneParam t("adam", Tensor::from_doubles({1}, {1.0}, DType::f64), {{"lr", lr}});
  double p = 1.0, m = 0, v = 0;
  const double grads[2] = {0.5, -0.25};
  for (int k = 1; k <= 2; ++k) {
    double g = grads[k - 1];
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * (g * g);
    double m_hat = m / (1 - std::pow(b1, k)), v_hat = v / (1 - std::pow(b2, k));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
    // The op folds the corrections into step size and denominator as PyTorch does, so the
    // textbook form agrees to rounding, not bit for bit.
    EXPECT_NEAR(t.step({g})[0], p, 1e-14);
  }
  EXPECT_EQ(t.ex->state(t.step_node, "step").at(0), 2);
  EXPECT_DOUBLE_EQ(t.ex->state(t.step_node, "exp_avg").at(0), m);
  EXPECT_DOUBLE_EQ(t.ex->state(t.step_node, "exp_avg_sq").at(0), v);
}

// Three f32 steps; expected values printed by torch.optim 1.13 on this data. Tolerance: one
// or two float ulps near 2 (2.4e-7 each), since PyTorch's vectorised kernels may round
// intermediate products differently.
const std::vector<std::vector<double>> kGrads = {
    {0.5, 0.25, -1.0}, {-0.25, 0.5, 2.0}, {0.125, -0.75, 0.0}};

TEST(Adam, MatchesPyTorchF32) {
  OneParam t("adam", Tensor::from_doubles({3}, {1.0, -2.0, 0.3}), {{"lr", 0.1}});
  const double want[3][3] = {{0.9000000357627869, -2.0999999046325684, 0.4000000059604645},
                             {0.8733663558959961, -2.1965181827545166, 0.36338964104652405},
                             {0.8393234610557556, -2.1898581981658936, 0.3350897431373596}};
  for (int k = 0; k < 3; ++k) {
    std::vector<double> p = t.step(kGrads[k]);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], want[k][i], 5e-7) << "step " << k << " i " << i;
  }
}

TEST(Sgd, MatchesPyTorchF32WithMomentumAndWeightDecay) {
  OneParam t("sgd", Tensor::from_doubles({3}, {1.0, -2.0, 0.3}),
             {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.01}});
  const double want[3][3] = {{0.9490000009536743, -2.0230000019073486, 0.39970001578330994},
                             {0.9271510243415833, -2.091676950454712, 0.2890303134918213},
                             {0.8940597772598267, -2.076394557952881, 0.18913854658603668}};
  for (int k = 0; k < 3; ++k) {
    std::vector<double> p = t.step(kGrads[k]);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], want[k][i], 5e-7) << "step " << k << " i " << i;
  }
}

TEST(Optim, BadAttributesAndInputsAreErrors) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::zeros({3}, DType::f32));
  ValueId g3 = g.input("g", {DType::f32, {3}});
  ValueId g4 = g.input("g4", {DType::f32, {4}});
  ValueId g64 = g.input("g64", {DType::f64, {3}});
  ValueId ints = g.input("ints", {DType::i32, {3}});
  expect_error([&] { g.apply("sgd", {p, g3}, {{"lr", 0.0}}); }, {"sgd", "lr", "> 0"});
  expect_error([&] { g.apply("sgd", {p, g3}, {{"lr", -1.0}}); }, {"sgd", "lr", "-1"});
  expect_error([&] { g.apply("sgd", {p, g3}, {{"momentum", 1.0}}); }, {"sgd", "momentum", "1"});
  expect_error(
      [&] {
        g.apply("sgd", {p, g3}, {{"weight_decay", -0.5}});
      },
      {"sgd", "weight_decay", "-0.5"});
  expect_error([&] { g.apply("sgd", {p, g3}, {{"nesterov", true}}); }, {"sgd", "nesterov"});
  expect_error([&] { g.apply("adam", {p, g3}, {{"beta1", 1.0}}); }, {"adam", "beta1"});
  expect_error([&] { g.apply("adam", {p, g3}, {{"beta2", -0.1}}); }, {"adam", "beta2"});
  expect_error([&] { g.apply("adam", {p, g3}, {{"eps", 0.0}}); }, {"adam", "eps"});
  expect_error([&] { g.apply("adam", {p, g3}, {{"lr", std::nan("")}}); }, {"adam", "lr"});
  expect_error([&] { g.apply("adam", {p, g4}); }, {"adam", "grad", "f32[4]", "f32[3]"});
  expect_error([&] { g.apply("adam", {p, g64}); }, {"adam", "grad", "f64[3]"});
  expect_error([&] { g.apply("sgd", {ints, ints}); }, {"sgd", "param", "i32"});
}

TEST(Optim, AddOptimizerRejectsNonParameters) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {x, x})});
  expect_error([&] { nn::add_optimizer(g, loss, {x}, {}); }, {"not a parameter"});
  ValueId p = g.parameter("p", Tensor::zeros({2}, DType::f32));
  expect_error([&] { nn::add_optimizer(g, loss, {p}, {"rmsprop"}); }, {"rmsprop"});
}

TEST(Optim, StepRunsAfterEveryReaderOfTheParameter) {
  // loss = sum(w * x); the fetched loss must use the old w even though the update node
  // runs in the same executor run, and w then moves by -lr * x.
  Graph g;
  ValueId w = g.parameter("w", Tensor::from_doubles({3}, {1, 2, 3}, DType::f64));
  ValueId x = g.input("x", {DType::f64, {3}});
  ValueId wx = g.apply1("mul", {w, x});
  ValueId loss = g.apply1("sum", {wx});
  std::vector<NodeId> steps = nn::add_optimizer(g, loss, {w}, {"sgd", 0.5, 0.0});
  ASSERT_EQ(steps.size(), 1u);
  for (NodeId reader : g.consumers(w)) {
    if (reader == steps[0]) continue;
    bool ordered = false;
    for (NodeId n : g.topological_order()) {
      if (n == reader) ordered = true;
      if (n == steps[0]) break;
    }
    EXPECT_TRUE(ordered) << "reader " << g.node(reader).name << " runs after the update";
  }
  Executor ex(g);
  Tensor xv = Tensor::from_doubles({3}, {1, -1, 2}, DType::f64);
  EXPECT_DOUBLE_EQ(ex.run({{"x", xv}}, {loss}, steps)[0].at(0), 1 - 2 + 6);
  EXPECT_EQ(ex.parameter("w").to_doubles(), (std::vector<double>{0.5, 2.5, 2.0}));
  EXPECT_DOUBLE_EQ(ex.run({{"x", xv}}, {loss}, steps)[0].at(0), 0.5 - 2.5 + 4);
}

}  // namespace
}  // namespace qg

namespace qg {
namespace {

// The CUDA kernels against the CPU kernels over several steps (GPU machines only).
TEST(OptimCuda, MatchesTheCpuKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  const std::vector<std::pair<std::string, Attrs>> cases = {
      {"sgd", {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.01}}},
      {"sgd", {{"lr", 0.05}, {"momentum", 0.8}, {"nesterov", true}}},
      {"adam", {{"lr", 0.1}, {"weight_decay", 0.001}}}};
  for (const auto& [op, attrs] : cases) {
    std::vector<double> init(1000), grads(1000);
    for (int i = 0; i < 1000; ++i) init[i] = std::sin(0.37 * i), grads[i] = std::cos(0.11 * i);
    std::vector<std::vector<double>> got;
    for (Device d : {Device::cpu(), Device::cuda()}) {
      Graph g;
      ValueId p = g.parameter("p", Tensor::from_doubles({1000}, init));
      ValueId gr = g.input("g", {DType::f32, {1000}});
      g.apply(op, {p, gr}, attrs, "p.step");
      NodeId step = g.num_nodes() - 1;
      Executor ex(g, d);
      for (int k = 0; k < 3; ++k) {
        std::vector<double> gk(grads);
        for (double& v : gk) v *= (k + 1) * 0.5;
        ex.run({{"g", Tensor::from_doubles({1000}, gk)}}, {}, {step});
      }
      got.push_back(ex.parameter("p").to(Device::cpu()).to_doubles());
      EXPECT_EQ(ex.state(step, "step").to(Device::cpu()).at(0), 3);
    }
    // Same f32 expressions; Adam's bias corrections use the device's pow, which may differ
    // from glibc's in the last bit before rounding to f32: allow 2 ulps.
    for (int i = 0; i < 1000; ++i)
      ASSERT_NEAR(got[0][i], got[1][i], 2.5e-7 * std::max(1.0, std::fabs(got[0][i])))
          << op << " element " << i;
  }
}

}  // namespace
}  // namespace qg
