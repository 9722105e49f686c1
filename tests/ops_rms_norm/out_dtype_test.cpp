// rms_norm's out_dtype (y narrowed from an f32 x to bf16/f16) and the fuse_norm_cast pass that
// makes it from an rms_norm -> [reshape] -> cast chain: y equals the cast of the f32 result bit
// for bit (CPU and GPU), rstd is unchanged, the gradients are those of the composition, the
// pass leaves the bf16-mixed Llama's training bit for bit unchanged, it stands back where it
// must, and bad out_dtype uses are named errors.
#include <gtest/gtest.h>

#include "autograd/grad.h"
#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/rms_norm/rms_norm_cast_fusion.h"
#include "runtime/compile.h"
#include "runtime/passes/pass.h"
#include "tests/common/llama_pass_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

Attrs norm_attrs(const char* out) {
  Attrs a{{"eps", 1e-5}};
  if (out != nullptr) a.set("out_dtype", std::string(out));
  return a;
}

void expect_equals_cast(Device device) {
  uint32_t seed = 3;
  for (const char* to : {"bf16", "f16"})
    for (const Shape& shape : {Shape{6, 96}, Shape{3, 2, 40}, Shape{5, 1}}) {
      SCOPED_TRACE(std::string(to) + " " + shape_str(shape));
      Tensor x = testing::random_f32(shape, seed++);
      Tensor w = testing::random_f32({shape.back()}, seed++);
      auto plain = run_op(device, "rms_norm", {x, w}, norm_attrs(nullptr));
      auto narrow = run_op(device, "rms_norm", {x, w}, norm_attrs(to));
      auto cast = run_op(device, "cast", {plain[0]}, {{"dtype", std::string(to)}});
      EXPECT_EQ(narrow[0].dtype(), dtype_from_name(to));
      EXPECT_TRUE(same_bits(narrow[0], cast[0]));
      EXPECT_TRUE(same_bits(narrow[1], plain[1]));
    }
}

TEST(RmsNormOutDtype, EqualsTheCastOfTheF32Result) {
  expect_equals_cast(Device::cpu());
}

TEST(RmsNormOutDtype, GpuEqualsTheCastOfTheF32Result) {
  QG_REQUIRE_GPU();
  expect_equals_cast(Device::cuda());
}

// dx and dweight through the narrowed y equal those through rms_norm -> cast.
TEST(RmsNormOutDtype, GradientIsTheComposition) {
  auto grads = [](bool narrow) {
    Graph g;
    ValueId x = g.input("x", {DType::f32, {4, 48}});
    ValueId w = g.input("w", {DType::f32, {48}});
    ValueId y = narrow ? g.apply("rms_norm", {x, w}, norm_attrs("bf16"))[0]
                       : g.apply1("cast", {g.apply("rms_norm", {x, w}, norm_attrs(nullptr))[0]},
                                  {{"dtype", std::string("bf16")}});
    ValueId u = g.input("u", {DType::bf16, {4, 48}});
    ValueId loss = g.apply1(
        "sum", {g.apply1("cast", {g.apply1("mul", {y, u})}, {{"dtype", std::string("f32")}})});
    std::vector<ValueId> d = grad(g, loss, {x, w});
    Executor ex(g, Device::cpu());
    return ex.run({{"x", testing::random_f32({4, 48}, 1)},
                   {"w", testing::random_f32({48}, 2)},
                   {"u", testing::random_f32({4, 48}, 3).cast(DType::bf16)}},
                  d);
  };
  const std::vector<Tensor> fused = grads(true), plain = grads(false);
  ASSERT_EQ(fused.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(fused[i], plain[i])) << i;
}

TEST(RmsNormOutDtype, BadUsesAreNamedErrors) {
  Tensor w16 = testing::random_f32({8}, 1).cast(DType::bf16);
  Tensor x16 = testing::random_f32({2, 8}, 2).cast(DType::bf16);
  expect_error(
      [&] {
        run_op(Device::cpu(), "rms_norm", {x16, w16}, norm_attrs("f16"));
      },
      {"rms_norm", "out_dtype", "narrows an f32 x only", "bf16"});
  Tensor x = testing::random_f32({2, 8}, 3), w = testing::random_f32({8}, 4);
  expect_error(
      [&] {
        run_op(Device::cpu(), "rms_norm", {x, w}, norm_attrs("i8"));
      },
      {"rms_norm", "out_dtype", "i8"});
}

// x -> rms_norm -> [reshape] -> cast (bf16); `extra` adds what may block the fusion.
std::string blocker(bool reshape, DType x_dtype, const char* to,
                    const std::function<void(Graph&, ValueId /*y*/)>& extra = nullptr) {
  Graph g;
  ValueId x = g.input("x", {x_dtype, {2, 4, 8}});
  ValueId w = g.input("w", {x_dtype, {8}});
  ValueId y = g.apply("rms_norm", {x, w}, norm_attrs(nullptr))[0];
  if (extra) extra(g, y);
  ValueId v = reshape ? g.apply1("reshape", {y}, {{"shape", Shape{8, 8}}}) : y;
  ValueId c = g.apply1("cast", {v}, {{"dtype", std::string(to)}});
  g.mark_output(c);
  return rms_norm_cast_fusion_blocker(g, g.value(c).producer);
}

TEST(NormCastFusion, StandsBackWhereItMust) {
  EXPECT_EQ(blocker(true, DType::f32, "bf16"), "");
  EXPECT_EQ(blocker(false, DType::f32, "f16"), "");
  EXPECT_EQ(blocker(true, DType::f32, "bf16", [](Graph& g, ValueId y) { g.mark_output(y); }),
            "y is a graph output or named (a run may fetch it)");
  EXPECT_EQ(blocker(true, DType::f32, "bf16",
                    [](Graph& g, ValueId y) { g.mark_output(g.apply1("relu", {y})); }),
            "y has another reader");
  EXPECT_EQ(blocker(true, DType::bf16, "f16"), "x is not f32");
  EXPECT_EQ(blocker(true, DType::f32, "f64"), "the cast does not narrow to bf16 or f16");
}

// The bf16-mixed float Llama: per layer the q/k/v and gate/up inputs' casts, and the lm_head's,
// fuse into their norms, and training is bit for bit the same.
TEST(NormCastFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_norm_cast", Device::cpu()), 2 * 2 + 1);
}

}  // namespace
}  // namespace qg
