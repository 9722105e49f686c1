// conv_bn_fold_weight and its backward (ops/fold): values by hand; the same bits, forward and
// every gradient, as the generic chain nn::conv_bn built before (add(running_var, eps) ->
// sqrt -> div -> reshape -> mul), in f32 and f64, inside a conv -> channel_div -> batch_norm
// block (gamma and scale_factor each with two readers, running_var updated in place by the
// batch norm) and with either output alone; bad inputs as named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

Tensor uniform(const Shape& shape, DType dt, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& e : v) e = dist(rng);
  return Tensor::from_doubles(shape, v, dt);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::vector<Tensor> run(Graph& g, const Executor::Feeds& feeds, const std::vector<ValueId>& out) {
  Executor ex(g);
  return ex.run(feeds, out);
}

// w [2, 1, 1, 2] = {1, -2 | 3, 0.5}, gamma {3, -1}, running_var {3.75, 0}, eps 0.25:
// running_std {2, 0.5}, scale_factor {1.5, -2}, w_fold {1.5, -3 | -6, -1}.
// Backward with d_w_fold {1, 2 | 4, -1} and d_scale_factor {0.5, 1}: dw = d_w_fold * sf =
// {1.5, 3 | -8, 2}; channel 0: 0.5 + (1 * 1 + 2 * -2) = -2.5, / 2 = -1.25; channel 1:
// 1 + (4 * 3 + -1 * 0.5) = 12.5, / 0.5 = 25.
TEST(ConvBnFold, ValuesAndGradientByHand) {
  for (DType dt : {DType::f32, DType::f64}) {
    Graph g;
    ValueId w = g.input("w", {dt, {2, 1, 1, 2}});
    ValueId gamma = g.input("gamma", {dt, {2}});
    ValueId var = g.input("var", {dt, {2}});
    auto f = g.apply("conv_bn_fold_weight", {w, gamma, var}, {{"eps", 0.25}});
    ValueId dwf = g.input("dwf", {dt, {2, 1, 1, 2}});
    ValueId dsf = g.input("dsf", {dt, {2}});
    auto b = g.apply("conv_bn_fold_weight_backward", {dwf, dsf, w, f[1], f[2]});
    auto got = run(g,
                   {{"w", Tensor::from_doubles({2, 1, 1, 2}, {1, -2, 3, 0.5}, dt)},
                    {"gamma", Tensor::from_doubles({2}, {3, -1}, dt)},
                    {"var", Tensor::from_doubles({2}, {3.75, 0}, dt)},
                    {"dwf", Tensor::from_doubles({2, 1, 1, 2}, {1, 2, 4, -1}, dt)},
                    {"dsf", Tensor::from_doubles({2}, {0.5, 1}, dt)}},
                   {f[0], f[1], f[2], b[0], b[1]});
    const std::string t = dtype_name(dt);
    EXPECT_EQ(got[0].to_doubles(), (std::vector<double>{1.5, -3, -6, -1})) << t;
    EXPECT_EQ(got[1].to_doubles(), (std::vector<double>{1.5, -2})) << t;
    EXPECT_EQ(got[2].to_doubles(), (std::vector<double>{2, 0.5})) << t;
    EXPECT_EQ(got[3].to_doubles(), (std::vector<double>{1.5, 3, -8, 2})) << t;
    EXPECT_EQ(got[4].to_doubles(), (std::vector<double>{-1.25, 25})) << t;
  }
}

// What nn::conv_bn built before the op: {w_fold, scale_factor}. eps is a scalar constant of
// the tensors' dtype (f32 in the model, holding float(eps)).
std::pair<ValueId, ValueId> generic_chain(Graph& g, ValueId w, ValueId gamma, ValueId var,
                                          double eps) {
  const TensorType wt = g.value(w).type;
  ValueId eps_c = g.constant(Tensor::scalar(eps, wt.dtype), "eps");
  ValueId running_std = g.apply1("sqrt", {g.apply1("add", {var, eps_c})});
  ValueId scale_factor = g.apply1("div", {gamma, running_std});
  Shape col(wt.shape.size(), 1);
  col[0] = wt.shape[0];
  ValueId sf_w = g.apply1("reshape", {scale_factor}, {{"shape", col}});
  return {g.apply1("mul", {w, sf_w}), scale_factor};
}

std::pair<ValueId, ValueId> fold(Graph& g, bool generic, ValueId w, ValueId gamma, ValueId var,
                                 double eps) {
  if (generic) return generic_chain(g, w, gamma, var, eps);
  auto f = g.apply("conv_bn_fold_weight", {w, gamma, var}, {{"eps", eps}});
  return {f[0], f[1]};
}

// conv(x, w_fold) -> channel_div(., scale_factor) -> batch_norm(., gamma, ...) in training:
// gamma and scale_factor have two readers each, and the batch norm updates running_var
// in place after the fold read it. Two steps, so the second fold reads the updated buffer.
struct Block {
  Graph g;
  std::vector<ValueId> fetch;
};

void build_block(Block& b, bool generic, DType dt, const Shape& xs, int64_t o, int64_t k) {
  Graph& g = b.g;
  const int64_t c = xs[1];
  ValueId x = g.input("x", {dt, xs});
  ValueId w = g.input("w", {dt, {o, c, k, k}});
  ValueId gamma = g.input("gamma", {dt, {o}});
  ValueId beta = g.input("beta", {dt, {o}});
  ValueId rm = g.parameter("rm", uniform({o}, dt, 1, -0.1, 0.1));
  ValueId rv = g.parameter("rv", uniform({o}, dt, 2, 1e-4, 3.0));
  auto [w_fold, sf] = fold(g, generic, w, gamma, rv, 1e-5);
  ValueId zero = g.constant(Tensor::zeros({o}, dt));
  ValueId conv =
      g.apply1("conv2d", {x, w_fold, zero}, {{"stride", Shape{1, 1}}, {"padding", Shape{1, 1}}});
  ValueId q = g.apply1("channel_div", {conv, sf});
  auto bn = g.apply("batch_norm", {q, gamma, beta, rm, rv}, {{"momentum", 0.1}, {"eps", 1e-5}});
  ValueId dy = g.input("dy", g.value(bn[0]).type);
  ValueId loss = g.apply1("sum", {g.apply1("mul", {bn[0], dy})});
  auto grads = grad(g, loss, {x, w, gamma, beta});
  b.fetch = {w_fold, sf, bn[0], grads[0], grads[1], grads[2], grads[3], rv};
}

TEST(ConvBnFold, SameBitsAsTheGenericChainInAConvBnBlock) {
  const char* what[] = {"w_fold", "scale_factor", "y",     "dx",
                        "dw",     "dgamma",       "dbeta", "running_var"};
  for (DType dt : {DType::f32, DType::f64}) {
    const Shape xs{3, 5, 6, 6};
    const int64_t o = 48, k = 3;
    Block generic, op;
    build_block(generic, true, dt, xs, o, k);
    build_block(op, false, dt, xs, o, k);
    Executor eg(generic.g), eo(op.g);
    for (int step = 0; step < 3; ++step) {
      const uint64_t s = 10 * step + 3;
      Executor::Feeds feeds = {{"x", uniform(xs, dt, s, -2, 2)},
                               {"w", uniform({o, xs[1], k, k}, dt, s + 1, -0.5, 0.5)},
                               {"gamma", uniform({o}, dt, s + 2, -1.5, 1.5)},
                               {"beta", uniform({o}, dt, s + 3, -0.2, 0.2)},
                               {"dy", uniform({xs[0], o, xs[2], xs[3]}, dt, s + 4, -1, 1)}};
      auto a = eg.run(feeds, generic.fetch);
      auto b = eo.run(feeds, op.fetch);
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(same_bits(a[i], b[i])) << dtype_name(dt) << " step " << step << " " << what[i];
    }
  }
}

// Outputs read alone (the other's gradient absent: zeros for d_scale_factor, which add no
// bit; no gradient for w when w_fold has none) and both read by independent weights, so
// that dgamma is the fold's own (in the conv-bn block batch_norm's share dominates it).
TEST(ConvBnFold, SameBitsAsTheGenericChainForEachOutputRead) {
  const char* reads[] = {"w_fold", "scale_factor", "both"};
  for (DType dt : {DType::f32, DType::f64})
    for (int read : {0, 1, 2}) {
      const Shape ws{64, 5, 3, 3};
      std::vector<Tensor> got[2];
      for (bool generic : {true, false}) {
        Graph g;
        ValueId w = g.input("w", {dt, ws});
        ValueId gamma = g.input("gamma", {dt, {64}});
        ValueId var = g.input("var", {dt, {64}});
        // Variances of eps's size, so that eps's rounding to T shows in running_std.
        auto [w_fold, sf] = fold(g, generic, w, gamma, var, 1e-5);
        ValueId r = g.input("r", {dt, ws}), r2 = g.input("r2", {dt, {64}});
        ValueId lw = g.apply1("sum", {g.apply1("mul", {w_fold, r})});
        ValueId ls = g.apply1("sum", {g.apply1("mul", {sf, r2})});
        ValueId loss = read == 0 ? lw : read == 1 ? ls : g.apply1("add", {lw, ls});
        auto grads = grad(g, loss, {w, gamma});
        got[generic] = run(g,
                           {{"w", uniform(ws, dt, 1, -1, 1)},
                            {"gamma", uniform({64}, dt, 2, -2, 2)},
                            {"var", uniform({64}, dt, 3, 0, 3e-5)},
                            {"r", uniform(ws, dt, 4, -1, 1)},
                            {"r2", uniform({64}, dt, 5, -3, 3)}},
                           {w_fold, sf, grads[0], grads[1]});
      }
      const char* what[] = {"w_fold", "scale_factor", "dw", "dgamma"};
      for (size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(same_bits(got[0][i], got[1][i]))
            << dtype_name(dt) << " read " << reads[read] << " " << what[i];
    }
}

// Zeros (of both signs), infinities and NaN through the fold and its backward: the same bits
// as the chain, NaN payloads included (the same operations on the same operands in order).
TEST(ConvBnFold, SpecialValuesMatchTheGenericChain) {
  const double inf = INFINITY, nan = NAN;
  const Shape ws{4, 3};
  std::vector<Tensor> got[2];
  for (bool generic : {true, false}) {
    Graph g;
    ValueId w = g.input("w", {DType::f32, ws});
    ValueId gamma = g.input("gamma", {DType::f32, {4}});
    ValueId var = g.input("var", {DType::f32, {4}});
    auto [w_fold, sf] = fold(g, generic, w, gamma, var, 1e-5);
    ValueId r = g.input("r", {DType::f32, ws}), r2 = g.input("r2", {DType::f32, {4}});
    ValueId loss = g.apply1("add", {g.apply1("sum", {g.apply1("mul", {w_fold, r})}),
                                    g.apply1("sum", {g.apply1("mul", {sf, r2})})});
    auto grads = grad(g, loss, {w, gamma});
    got[generic] = run(
        g,
        {{"w", Tensor::from_doubles(ws, {0.0, -0.0, 1, inf, -2, 0.5, nan, 1, 1, -0.0, 2, 3},
                                    DType::f32)},
         {"gamma", Tensor::from_doubles({4}, {-0.0, 2, 1, -1}, DType::f32)},
         {"var", Tensor::from_doubles({4}, {1, -1e-5, 0, -2}, DType::f32)},
         {"r", Tensor::from_doubles(ws, {1, 1, -0.0, 0, 1, 1, 1, nan, 2, 1, 0, -1}, DType::f32)},
         {"r2", Tensor::from_doubles({4}, {0.5, -0.0, inf, 1}, DType::f32)}},
        {w_fold, sf, grads[0], grads[1]});
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(same_bits(got[0][i], got[1][i])) << "value " << i;
}

TEST(ConvBnFoldErrors, BadInputsNameTheOpAndValues) {
  Graph g;
  auto in = [&](const std::string& n, Shape s, DType d = DType::f32) { return g.input(n, {d, s}); };
  ValueId w = in("w", {4, 2, 3, 3}), v4 = in("v4", {4}), v3 = in("v3", {3});
  ValueId v4d = in("v4d", {4}, DType::f64), w0 = in("w0", {}), wi = in("wi", {4, 2}, DType::i32);
  ValueId wh = in("wh", {4, 2}, DType::f16), vh = in("vh", {4}, DType::f16);
  const char* op = "conv_bn_fold_weight";
  expect_error(
      [&] {
        g.apply(op, {w, v3, v4});
      },
      {op, "gamma must be [4]", "f32[3]", "f32[4, 2, 3, 3]"});
  expect_error([&] { g.apply(op, {w, v4, v3}); }, {op, "running_var must be [4]", "f32[3]"});
  expect_error([&] { g.apply(op, {w, v4d, v4}); }, {op, "gamma f64[4]", "w's dtype f32"});
  expect_error([&] { g.apply(op, {w, v4, v4d}); }, {op, "running_var f64[4]"});
  expect_error([&] { g.apply(op, {w0, v4, v4}); }, {op, "rank >= 1", "f32[]"});
  expect_error([&] { g.apply(op, {wi, v4, v4}); }, {op, "i32"});
  expect_error([&] { g.apply(op, {wh, vh, vh}); }, {op, "f16"});
  for (double eps : {0.0, -1e-5, 1e-60, double{INFINITY}, double{NAN}})
    expect_error([&] { g.apply(op, {w, v4, v4}, {{"eps", eps}}); }, {op, "'eps'", "positive"});
  // 1e-60 is a positive double but 0 in f32; f64 keeps it.
  ValueId wd = in("wd", {4, 2}, DType::f64);
  EXPECT_NO_THROW(g.apply(op, {wd, v4d, v4d}, {{"eps", 1e-60}}));

  const char* back = "conv_bn_fold_weight_backward";
  ValueId d5 = in("d5", {4, 2, 3, 5});
  expect_error(
      [&] {
        g.apply(back, {d5, v4, w, v4, v4});
      },
      {back, "d_w_fold f32[4, 2, 3, 5]", "must match w f32[4, 2, 3, 3]"});
  expect_error([&] { g.apply(back, {w, v3, w, v4, v4}); }, {back, "d_scale_factor must be [4]"});
  expect_error([&] { g.apply(back, {w, v4, w, v3, v4}); }, {back, "scale_factor must be [4]"});
  expect_error([&] { g.apply(back, {w, v4, w, v4, v4d}); }, {back, "running_std f64[4]"});
}

}  // namespace
}  // namespace qg
