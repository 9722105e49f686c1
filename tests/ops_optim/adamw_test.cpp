// adamw and clip_grad_norm on the CPU: hand-derived steps of torch's formulas, the runtime
// rate against a step recompiled at that rate (bit for bit), and every bad input. There is no
// f64 gradcheck: optimizer updates are not differentiable ops (no backward), so their
// reference is torch.optim itself (adamw_torch_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/core/test_util.h"
#include "tests/ops_optim/adamw_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::OptimizerGraph;
using testing::wave;

nn::OptimizerConfig adamw(double wd, double clip = 0.0) {
  nn::OptimizerConfig c;
  c.kind = "adamw";
  c.lr = 0.05;
  c.weight_decay = wd;
  c.clip_grad_norm = clip;
  return c;
}

TEST(AdamW, StepsFollowTorchsDecoupledFormula) {
  // f64, in the op's own order of operations, so the hand-derived values are exact.
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  const double rates[3] = {0.05, 0.02, 0.125};
  const double grads[3] = {0.5, -0.25, 2.0};
  OptimizerGraph t({Tensor::from_doubles({1}, {1.5}, DType::f64)}, adamw(wd));
  double p = 1.5, m = 0, v = 0;
  for (int k = 1; k <= 3; ++k) {
    const double lr = rates[k - 1], g = grads[k - 1];
    p = p * (1.0 - lr * wd);  // decay first, from the old parameter
    m = b1 * m + (1.0 - b1) * g;
    v = b2 * v + (1.0 - b2) * (g * g);
    const double step_size = lr / (1.0 - std::pow(b1, k));
    const double denom = std::sqrt(v) / std::sqrt(1.0 - std::pow(b2, k)) + eps;
    p = p - step_size * (m / denom);
    t.step({Tensor::from_doubles({1}, {g}, DType::f64)}, lr);
    EXPECT_EQ(t.values(0)[0], p) << "step " << k;
  }
  EXPECT_EQ(t.state(0, "step").at(0), 3);
  EXPECT_EQ(t.state(0, "exp_avg").at(0), m);
  EXPECT_EQ(t.state(0, "exp_avg_sq").at(0), v);
}

TEST(AdamW, ZeroDecayAtFirstStepMovesByLrTimesSign) {
  OptimizerGraph t({Tensor::from_doubles({3}, {1.0, -2.0, 0.3}, DType::f64)}, adamw(0.0));
  t.step({Tensor::from_doubles({3}, {0.5, -0.25, 4.0}, DType::f64)}, 0.1);
  std::vector<double> p = t.values(0);
  EXPECT_NEAR(p[0], 0.9, 1e-7);
  EXPECT_NEAR(p[1], -1.9, 1e-7);
  EXPECT_NEAR(p[2], 0.2, 1e-7);
}

// The runtime rate changed between runs of one graph against a graph built afresh at each
// rate (its variable starts there; no set_learning_rate) that takes over the states: the same
// bits. For adam (decoupled = false) the recompiled step is the adam op with the rate as its
// attribute, the path of every adam step that does not use the runtime rate.
TEST(AdamW, RuntimeRateMatchesAStepRecompiledAtThatRateBitForBit) {
  const double rates[4] = {0.1, 0.037, 0.0123, 3e-3};  // not f32-representable on purpose
  for (const std::string kind : {"adamw", "adam"}) {
    SCOPED_TRACE(kind);
    nn::OptimizerConfig c = adamw(0.05);
    c.kind = kind;
    c.runtime_lr = true;
    const Tensor init = wave({40}, 0.37, 1.0);
    OptimizerGraph runtime({init}, c);
    Tensor p = init.clone(), m = Tensor::zeros({40}, DType::f32), v = m.clone();
    Tensor step = Tensor::zeros({1}, DType::i64);
    for (int k = 0; k < 4; ++k) {
      const Tensor g = wave({40}, 0.11 * (k + 1), 0.5 * (k + 1));
      runtime.step({g}, rates[k]);
      Graph fresh;
      ValueId pv = fresh.parameter("p0", p), gv = fresh.input("g0", {DType::f32, {40}});
      NodeId node;
      if (kind == "adam") {
        fresh.apply("adam", {pv, gv}, {{"lr", rates[k]}, {"weight_decay", 0.05}}, "p0.adam");
        node = fresh.num_nodes() - 1;
      } else {
        nn::OptimizerConfig at = c;
        at.lr = rates[k];
        node = nn::optimizer_nodes(at)(fresh, {pv}, {gv})[0];
      }
      Executor ex(fresh);
      ex.state(node, "exp_avg") = m;
      ex.state(node, "exp_avg_sq") = v;
      ex.state(node, "step") = step;
      ex.run({{"g0", g}}, {}, {node});
      p = ex.parameter("p0").clone();
      m = ex.state(node, "exp_avg").clone();
      v = ex.state(node, "exp_avg_sq").clone();
      step = ex.state(node, "step").clone();
      ASSERT_EQ(runtime.values(0), p.to_doubles()) << "step " << k;
      ASSERT_EQ(runtime.state(0, "exp_avg").to_doubles(), m.to_doubles()) << "step " << k;
    }
  }
}

TEST(ClipGradNorm, HandComputedNormAndCoefficient) {
  // |(3, 4)| = 5 and |12| = 12, so the total is 13 exactly.
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}}), b = g.input("b", {DType::f32, {1}});
  ValueId clipped = g.apply("clip_grad_norm", {a, b}, {{"max_norm", 0.5}})[1];
  std::vector<ValueId> loose = g.apply("clip_grad_norm", {a, b}, {{"max_norm", 20.0}});
  Executor ex(g);
  std::vector<Tensor> out =
      ex.run({{"a", Tensor::from_doubles({2}, {3, -4})}, {"b", Tensor::from_doubles({1}, {12})}},
             {clipped, loose[0], loose[1]});
  // torch: max_norm / (norm + 1e-6) is (norm + 1e-6).reciprocal() * max_norm, in f32.
  const float want = (1.0f / (13.0f + 1e-6f)) * 0.5f;
  EXPECT_EQ(out[0].to_doubles()[0], static_cast<double>(want));
  EXPECT_EQ(out[1].to_doubles()[0], 13.0);
  EXPECT_EQ(out[2].to_doubles()[0], 1.0);  // unclipped: clamped to exactly 1
}

TEST(ClipGradNorm, ScalesEveryGradientBeforeTheUpdate) {
  // Clipping to max_norm scales both gradients by c; an update with the scaled gradients
  // fed directly (no clipping) must give the same parameters.
  const std::vector<Tensor> init = {wave({6}, 0.3, 1.0), wave({3, 2}, 0.7, 2.0)};
  const std::vector<Tensor> grads = {wave({6}, 0.9, 3.0), wave({3, 2}, 0.4, 5.0)};
  OptimizerGraph clip(init, adamw(0.1, 1.0));
  const double norm = clip.step(grads, 0.01);
  double sq = 0;
  for (const Tensor& t : grads) {
    double s = 0;
    for (double x : t.to_doubles()) s += x * x;
    const double n = static_cast<float>(std::sqrt(s));
    sq += n * n;
  }
  EXPECT_EQ(norm, static_cast<double>(static_cast<float>(std::sqrt(sq))));
  ASSERT_GT(norm, 1.0);
  const float coef = (1.0f / (static_cast<float>(norm) + 1e-6f)) * 1.0f;
  OptimizerGraph plain(init, adamw(0.1));
  std::vector<Tensor> scaled;
  for (const Tensor& t : grads) {
    std::vector<double> v = t.to_doubles();
    for (double& x : v) x = static_cast<float>(static_cast<float>(x) * coef);
    scaled.push_back(Tensor::from_doubles(t.shape(), v));
  }
  plain.step(scaled, 0.01);
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(clip.values(k), plain.values(k)) << k;
}

TEST(ClipGradNorm, NonFiniteNormIsAnErrorAndTheStepIsSkipped) {
  const std::vector<Tensor> init = {wave({4}, 0.3, 1.0), wave({2}, 0.5, 1.0)};
  OptimizerGraph t(init, adamw(0.1, 1.0));
  t.step({wave({4}, 0.2, 1.0), wave({2}, 0.6, 1.0)}, 0.01);
  const std::vector<double> before = t.values(0), m = t.state(0, "exp_avg").to_doubles();
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    Tensor g = wave({2}, 0.6, 1.0);
    g.data<float>()[1] = static_cast<float>(bad);
    expect_error(
        [&] {
          t.step({wave({4}, 0.2, 1.0), g}, 0.01);
        },
        {"clip_grad_norm", "2 gradients", "not finite", "the step was skipped"});
    EXPECT_EQ(t.values(0), before);
    EXPECT_EQ(t.state(0, "exp_avg").to_doubles(), m);
    EXPECT_EQ(t.state(0, "step").at(0), 1);
  }
}

TEST(AdamW, BadInputsAreNamedErrors) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::zeros({3}, DType::f32));
  ValueId gr = g.input("g", {DType::f32, {3}});
  ValueId lr = g.variable("lr", Tensor::from_doubles({}, {0.1}, DType::f64));
  ValueId lr32 = g.input("lr32", {DType::f32, {}});
  ValueId one = g.input("one", {DType::f32, {}});
  ValueId one64 = g.input("one64", {DType::f64, {}});
  ValueId ints = g.input("ints", {DType::i32, {3}});
  expect_error(
      [&] {
        g.apply("adamw", {p, gr, lr, one}, {{"weight_decay", -0.1}});
      },
      {"adamw", "weight_decay", "-0.1"});
  expect_error([&] { g.apply("adamw", {p, gr, lr, one}, {{"eps", 0.0}}); }, {"adamw", "eps"});
  expect_error(
      [&] {
        g.apply("adamw", {p, gr, lr32, one});
      },
      {"adamw", "lr must be an f64 scalar", "f32"});
  expect_error(
      [&] {
        g.apply("adamw", {p, gr, lr, one64});
      },
      {"adamw", "grad_scale must be an f32 scalar", "f64"});
  expect_error([&] { g.apply("adamw", {p, ints, lr, one}); }, {"adamw", "grad", "i32"});
  expect_error([&] { g.apply("adamw", {p, gr, lr}); }, {"adamw", "expects 4 inputs, got 3"});
  expect_error(
      [&] {
        g.apply("clip_grad_norm", {gr}, {{"max_norm", 0.0}});
      },
      {"clip_grad_norm", "max_norm", "> 0"});
  expect_error(
      [&] {
        g.apply("clip_grad_norm", {gr}, {{"max_norm", -1.0}});
      },
      {"clip_grad_norm", "max_norm", "-1"});
  expect_error([&] { g.apply("clip_grad_norm", {}); },
               {"clip_grad_norm", "expects 1 or more inputs, got 0"});
  expect_error(
      [&] {
        g.apply("clip_grad_norm", {gr, ints});
      },
      {"clip_grad_norm", "gradient 1", "i32"});

  // The config names its field before any graph is touched.
  nn::OptimizerConfig c = adamw(-0.1);
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "weight_decay -0.1", ">= 0"});
  c = adamw(0.1, -1.0);
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "clip_grad_norm -1"});
  c = adamw(0.1, std::nan(""));
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "clip_grad_norm nan"});
  c = adamw(0.1);
  c.kind = "adamx";
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "'adamx'", "adam, adamw, sgd"});
  c = adamw(0.0, 1.0);
  c.kind = "sgd";
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "sgd", "clip_grad_norm"});
  c = adamw(0.0);
  c.lr = 0.0;
  expect_error([&] { nn::optimizer_nodes(c); }, {"nn.optimizer", "learning rate 0"});
}

TEST(AdamW, BadRuntimeRatesAreNamedErrors) {
  OptimizerGraph t({wave({4}, 0.3, 1.0)}, adamw(0.1));
  expect_error([&] { nn::set_learning_rate(*t.ex, -1.0); },
               {"nn.optimizer", "learning rate -1", ">= 0"});
  expect_error([&] { nn::set_learning_rate(*t.ex, std::nan("")); },
               {"nn.optimizer", "learning rate nan"});
  // A rate written into the variable directly is checked where the update reads it, and the
  // step leaves everything as it was.
  const std::vector<double> before = t.values(0);
  Tensor& rate = t.ex->state(t.g.value(t.g.find(nn::kLearningRateName)).producer, "value");
  rate.data<double>()[0] = -0.5;
  expect_error([&] { t.step({wave({4}, 0.2, 1.0)}); },
               {"adamw", "learning rate -0.5", "the step was skipped"});
  EXPECT_EQ(t.values(0), before);
  EXPECT_EQ(t.state(0, "step").at(0), 0);
  // A graph whose optimizer takes its rate as an attribute has no variable to write.
  nn::OptimizerConfig plain;
  OptimizerGraph adam({wave({4}, 0.3, 1.0)}, plain);
  expect_error([&] { nn::set_learning_rate(*adam.ex, 0.1); },
               {"nn.optimizer", "no runtime learning rate", "optimizer.lr"});
}

TEST(AdamW, NonFiniteGradScaleFedDirectlyIsAnError) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::from_doubles({2}, {1, 2}));
  ValueId gr = g.input("g", {DType::f32, {2}});
  ValueId lr = g.variable("lr", Tensor::from_doubles({}, {0.1}, DType::f64));
  ValueId scale = g.input("s", {DType::f32, {}});
  g.apply("adamw", {p, gr, lr, scale}, {}, "p.adamw");
  NodeId step = g.num_nodes() - 1;
  Executor ex(g);
  Executor::Feeds feeds = {{"g", Tensor::from_doubles({2}, {1, 1})},
                           {"s", Tensor::from_doubles({}, {std::nan("")})}};
  expect_error([&] { ex.run(feeds, {}, {step}); }, {"adamw", "grad_scale nan", "not finite"});
  EXPECT_EQ(ex.parameter("p").to_doubles(), (std::vector<double>{1, 2}));
}

}  // namespace
}  // namespace qg
