// gelu (both forms) and silu with their derivatives at a few points whose values come from
// the defining formulas evaluated in double (Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi its
// density, sigmoid s = 1 / (1 + e^-x)); bad inputs; gradients through grad().
#include <gtest/gtest.h>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;

const std::vector<double> kPoints = {1, -1, 2, -0.5, 0};

std::vector<double> run_unary(const std::string& op, DType dtype, const Attrs& attrs = {}) {
  Tensor x = Tensor::from_doubles({5}, kPoints, dtype);
  return testing::run_op(Device::cpu(), op, {x}, attrs)[0].to_doubles();
}

// d op / dx at kPoints, through the registered backward rule (seeded with ones).
std::vector<double> run_grad(const std::string& op, const Attrs& attrs = {}) {
  Graph g;
  ValueId x = g.input("x", {DType::f64, {5}});
  ValueId dy = g.input("dy", {DType::f64, {5}});
  ValueId y = g.apply1(op, {x}, attrs);
  ValueId dx = grad_with_seed(g, y, dy, {x})[0];
  Executor ex(g);
  return ex
      .run({{"x", Tensor::from_doubles({5}, kPoints, DType::f64)},
            {"dy", Tensor::from_doubles({5}, std::vector<double>(5, 1.0), DType::f64)}},
           {dx})[0]
      .to_doubles();
}

void expect_values(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "at x = " << kPoints[i];
}

TEST(Gelu, ErfFormIsXTimesNormalCdf) {
  // x * Phi(x): Phi(1) = 0.8413447460685429, Phi(-1) = 1 - Phi(1), Phi(2) = 0.97724986805.
  const std::vector<double> want = {0.8413447460685429, -0.15865525393145707, 1.9544997361036416,
                                    -0.15426876936299344, 0.0};
  expect_values(run_unary("gelu", DType::f64), want, 1e-15);
  expect_values(run_unary("gelu", DType::f32), want, 1e-6);
  expect_values(run_unary("gelu", DType::f64, {{"approximate", "none"}}), want, 1e-15);
}

TEST(Gelu, TanhForm) {
  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
  const std::vector<double> want = {0.8411919906082768, -0.15880800939172324, 1.954597694087775,
                                    -0.15428599017485606, 0.0};
  expect_values(run_unary("gelu", DType::f64, {{"approximate", "tanh"}}), want, 1e-15);
  expect_values(run_unary("gelu", DType::f32, {{"approximate", "tanh"}}), want, 1e-6);
}

TEST(Gelu, DerivativesOfBothForms) {
  // erf form: Phi(x) + x phi(x), e.g. 0.8413447460685429 + 0.24197072451914337 at 1.
  expect_values(
      run_grad("gelu"),
      {1.0833154705876864, -0.08331547058768629, 1.085231801078197, 0.13250487534383712, 0.5},
      1e-14);
  // tanh form: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
  expect_values(
      run_grad("gelu", {{"approximate", "tanh"}}),
      {1.0829640838457826, -0.08296408384578255, 1.0860992566236183, 0.13263009646535764, 0.5},
      1e-14);
}

TEST(Silu, ValuesAndDerivative) {
  // x s(x): s(1) = 0.7310585786300049; derivative s (1 + x (1 - s)), 0.5 at 0.
  expect_values(
      run_unary("silu", DType::f64),
      {0.7310585786300049, -0.2689414213699951, 1.7615941559557646, -0.1887703343990727, 0.0},
      1e-15);
  expect_values(
      run_unary("silu", DType::f32),
      {0.7310585786300049, -0.2689414213699951, 1.7615941559557646, -0.1887703343990727, 0.0},
      1e-6);
  expect_values(
      run_grad("silu"),
      {0.9276705118714869, 0.07232948812851325, 1.0907842487848955, 0.2600388126973482, 0.5},
      1e-14);
}

TEST(ActivationErrors, BadApproximateNonFloatAndShapeMismatch) {
  expect_error(
      [] {
        Graph g;
        g.apply("gelu", {g.input("x", {DType::f32, {3}})}, {{"approximate", "sigmoid"}});
      },
      {"gelu", "approximate", "sigmoid"});
  for (const char* op : {"gelu", "silu"})
    expect_error(
        [op] {
          Graph g;
          g.apply(op, {g.input("x", {DType::i32, {3}})});
        },
        {std::string("[") + op + "]", "floating point", "i32"});
  for (const char* op : {"gelu_backward", "silu_backward"})
    expect_error(
        [op] {
          Graph g;
          g.apply(op, {g.input("dy", {DType::f32, {3}}), g.input("x", {DType::f32, {4}})});
        },
        {std::string("[") + op + "]", "f32[3]", "f32[4]", "same shape"});
}

// GPU against CPU: CUDA's erff/tanhf/expf are within a few ulps of libm, so the comparison
// is the cross-check's 1e-5 relative (of the largest |value|), bit-exact not expected.
TEST(ActivationGpu, MatchesCpuWithinTranscendentalTolerance) {
  QG_REQUIRE_GPU();
  std::vector<double> v(4099);
  for (size_t i = 0; i < v.size(); ++i) v[i] = -8.0 + 16.0 * static_cast<double>(i) / 4098.0;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor x = Tensor::from_doubles({4099}, v, dtype);
    Tensor dy = Tensor::from_doubles({4099}, std::vector<double>(v.rbegin(), v.rend()), dtype);
    const double tol = dtype == DType::f16    ? 2 * 0.00048828125
                       : dtype == DType::bf16 ? 2 * 0.00390625
                                              : 1e-5;
    struct Case {
      std::string op;
      std::vector<Tensor> in;
      Attrs attrs;
    };
    const std::vector<Case> cases = {{"gelu", {x}, {}},
                                     {"gelu", {x}, {{"approximate", "tanh"}}},
                                     {"gelu_backward", {dy, x}, {}},
                                     {"gelu_backward", {dy, x}, {{"approximate", "tanh"}}},
                                     {"silu", {x}, {}},
                                     {"silu_backward", {dy, x}, {}}};
    for (const Case& c : cases) {
      auto cpu = testing::run_op(Device::cpu(), c.op, c.in, c.attrs)[0].to_doubles();
      auto gpu = testing::run_op(Device::cuda(), c.op, c.in, c.attrs)[0].to_doubles();
      double scale = 1e-30;
      for (double e : cpu) scale = std::max(scale, std::abs(e));
      double worst = 0;
      for (size_t i = 0; i < cpu.size(); ++i)
        worst = std::max(worst, std::abs(cpu[i] - gpu[i]) / scale);
      EXPECT_LE(worst, tol) << c.op << " " << dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace qg
