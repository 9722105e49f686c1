// The RMSNorm layer: its weight parameter by name (ones, trainable, read by the op), its
// output against the rms_norm op, the weight's cast when x comes in bf16 under a mixed
// policy, the weight's gradient, and a bad input named by layer.
#include <gtest/gtest.h>

#include "autograd/grad.h"
#include "nn/builder.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

TEST(RmsNormLayer, OwnsItsWeightAndNormalises) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 3, 4}});
  ValueId y = b.rms_norm(x, "block0.input_layernorm", 1e-5);
  ASSERT_EQ(b.parameters().size(), 1u);
  EXPECT_EQ(g.value(b.parameters()[0]).type, (TensorType{DType::f32, {4}}));
  Executor ex(g);
  EXPECT_EQ(ex.parameter("block0.input_layernorm.weight").to_doubles(),
            (std::vector<double>(4, 1.0)));
  Tensor xv = testing::random_f32({2, 3, 4}, 5);
  Tensor w = Tensor::from_doubles({4}, {0.5, 1, 2, -1}, DType::f32);
  ex.parameter("block0.input_layernorm.weight") = w;
  Tensor got = ex.run({{"x", xv}}, {y})[0];
  Tensor want = run_op(Device::cpu(), "rms_norm", {xv, w}, {{"eps", 1e-5}})[0];
  EXPECT_TRUE(same_bits(got, want));
}

// d/dweight of sum(y) is the column sum of x * rstd.
TEST(RmsNormLayer, WeightGetsItsGradient) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 2}});
  ValueId loss = g.apply1("sum", {b.rms_norm(x, "norm", 3.5)});
  ValueId dw = grad(g, loss, b.parameters())[0];
  Executor ex(g);
  // Rows [3, 4] and [4, 3]: rstd 1/4 each (mean square 12.5 + 3.5 = 16).
  Tensor xv = Tensor::from_doubles({2, 2}, {3, 4, 4, 3}, DType::f32);
  EXPECT_EQ(ex.run({{"x", xv}}, {dw})[0].to_doubles(), (std::vector<double>{1.75, 1.75}));
}

// bf16 activations, f32 master weight: the layer reads a bf16 cast of the weight.
TEST(RmsNormLayer, CastsAnF32WeightToBf16Activations) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1, nn::PrecisionPolicy::bf16_mixed());
  ValueId x = g.input("x", {DType::bf16, {3, 8}});
  ValueId y = b.rms_norm(x, "norm");
  EXPECT_EQ(g.value(y).type.dtype, DType::bf16);
  EXPECT_EQ(g.value(b.parameters()[0]).type.dtype, DType::f32);
  Executor ex(g);
  Tensor xv = testing::random_f32({3, 8}, 2).cast(DType::bf16);
  Tensor want = run_op(Device::cpu(), "rms_norm",
                       {xv, Tensor::from_doubles({8}, std::vector<double>(8, 1.0), DType::bf16)},
                       {{"eps", 1e-6}})[0];
  EXPECT_TRUE(same_bits(ex.run({{"x", xv}}, {y})[0], want));
}

TEST(RmsNormLayer, ScalarInputIsANamedError) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {}});
  expect_error([&] { b.rms_norm(x, "model.norm"); }, {"nn.rms_norm", "model.norm", "f32[]"});
}

}  // namespace
}  // namespace qg
