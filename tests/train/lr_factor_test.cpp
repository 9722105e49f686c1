// OptimizerConfig::lr_factors: a listed parameter is updated exactly as with the rate times its
// factor (runtime rate: adamw; attribute rate: adam, sgd), the others as before; a factor that
// is not finite and positive is a named error.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/compile.h"
#include "tests/core/test_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

// loss = sum(a * a) + sum(b * b * b); one step; returns a and b after it.
std::vector<Tensor> one_step(nn::OptimizerConfig opt) {
  Graph g;
  ValueId a = g.parameter("a", Tensor::from_doubles({3}, {0.5, -1.0, 2.0}, DType::f32));
  ValueId b = g.parameter("b", Tensor::from_doubles({2}, {0.25, -0.75}, DType::f32));
  ValueId la = g.apply1("sum", {g.apply1("mul", {a, a})});
  ValueId lb = g.apply1("sum", {g.apply1("mul", {g.apply1("mul", {b, b}), b})});
  ValueId loss = g.apply1("add", {la, lb});
  CompiledStep step(g, {loss, {a, b}, nn::optimizer_nodes(opt), {}}, {});
  step.train({}, {loss});
  step.synchronize();
  return {step.executor().parameter("a").clone(), step.executor().parameter("b").clone()};
}

bool same(const Tensor& x, const Tensor& y) {
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

TEST(LrFactors, AListedParameterStepsAtTheScaledRate) {
  for (const std::string kind : {"adamw", "adam", "sgd"}) {
    SCOPED_TRACE(kind);
    nn::OptimizerConfig base;
    base.kind = kind;
    base.lr = 0.1;
    nn::OptimizerConfig scaled = base;
    scaled.lr_factors = {{"b", 0.5}};
    nn::OptimizerConfig slow = base;
    slow.lr = 0.05;
    const std::vector<Tensor> got = one_step(scaled), at_base = one_step(base),
                              at_slow = one_step(slow);
    EXPECT_TRUE(same(got[0], at_base[0]));  // a: the rate
    EXPECT_TRUE(same(got[1], at_slow[1]));  // b: the rate times 0.5
    EXPECT_FALSE(same(got[1], at_base[1]));
  }
}

TEST(LrFactors, BadFactorsAreNamedErrors) {
  for (double f : {0.0, -1.0, std::nan("")}) {
    nn::OptimizerConfig c;
    c.lr_factors = {{"model.layers.0.mlp.up_proj.weight_scale", f}};
    testing::expect_error([&] { c.validate(); },
                          {"[nn.optimizer]", "rate factor", "up_proj.weight_scale", "> 0"});
  }
}

}  // namespace
}  // namespace qg
