// adam and sgd reading the bf16/f16 gradient of an f32 parameter, and the fuse_grad_cast pass
// that removes the gradient's widening cast: the steps equal cast-then-step bit for bit on the
// CPU and the GPU (parameter and every state), the pass leaves the bf16-mixed Llama's training
// bit for bit unchanged, it stands back where it must, and bad gradient dtypes are named
// errors.
#include <gtest/gtest.h>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/optim/optim_cast_fusion.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/llama_pass_check.h"
#include "tests/common/tensor_compare.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::first_difference;

struct StepCase {
  std::string op;
  Attrs attrs;
  DType grad;
};

// p (f32 [37]) -> op(p, g) with g fed in `c.grad`, directly or through a cast to f32.
// Returns the parameter and states after three steps with different gradients.
std::vector<Tensor> run_steps(const StepCase& c, bool through_cast, Device device) {
  Graph g;
  ValueId p = g.parameter("p", testing::random_f32({37}, 5));
  ValueId grad = g.input("g", {c.grad, {37}});
  if (through_cast) grad = g.apply1("cast", {grad}, {{"dtype", std::string("f32")}});
  g.apply(c.op, {p, grad}, c.attrs, "p.step");
  const NodeId step = g.num_nodes() - 1;
  Executor ex(g, device);
  for (uint32_t s = 0; s < 3; ++s) {
    Tensor gv = testing::random_f32({37}, 20 + s);
    gv.data<float>()[3] = -0.0f;
    ex.run({{"g", gv.cast(c.grad)}}, {}, {step});
  }
  std::vector<Tensor> out = {ex.parameter("p").to(Device::cpu())};
  for (const Tensor& t : ex.states(step)) out.push_back(t.to(Device::cpu()));
  return out;
}

const std::vector<StepCase>& cases() {
  static const std::vector<StepCase> c = {
      {"adam", {{"lr", 1e-2}}, DType::bf16},
      {"adam", {{"lr", 1e-2}, {"weight_decay", 0.1}}, DType::f16},
      {"sgd", {{"lr", 1e-2}, {"momentum", 0.9}}, DType::bf16},
  };
  return c;
}

void expect_narrow_grad_equals_cast(Device device) {
  for (const StepCase& c : cases()) {
    SCOPED_TRACE(c.op + " " + dtype_name(c.grad));
    const std::vector<Tensor> narrow = run_steps(c, false, device);
    const std::vector<Tensor> cast = run_steps(c, true, device);
    ASSERT_EQ(narrow.size(), cast.size());
    for (size_t i = 0; i < narrow.size(); ++i) EXPECT_EQ(first_difference(narrow[i], cast[i]), "");
  }
}

TEST(NarrowGradStep, EqualsCastThenStep) {
  expect_narrow_grad_equals_cast(Device::cpu());
}

TEST(NarrowGradStep, GpuEqualsCastThenStepAndTheCpu) {
  QG_REQUIRE_GPU();
  expect_narrow_grad_equals_cast(Device::cuda());
  for (const StepCase& c : cases()) {
    SCOPED_TRACE(c.op + " " + dtype_name(c.grad) + " against the CPU");
    const std::vector<Tensor> gpu = run_steps(c, false, Device::cuda());
    const std::vector<Tensor> cpu = run_steps(c, false, Device::cpu());
    for (size_t i = 0; i < gpu.size(); ++i) EXPECT_EQ(first_difference(gpu[i], cpu[i]), "");
  }
}

TEST(NarrowGradStep, BadGradientDtypesAreNamedErrors) {
  for (const auto& [param, grad] : std::vector<std::pair<DType, DType>>{
           {DType::f32, DType::f64}, {DType::f64, DType::bf16}, {DType::f32, DType::i32}}) {
    Graph g;
    ValueId p = g.parameter("p", Tensor::zeros({4}, param));
    ValueId gv = g.input("g", {grad, {4}});
    testing::expect_error(
        [&] {
          g.apply("adam", {p, gv});
        },
        {"adam", "grad", dtype_name(grad), "must match param"});
  }
}

std::string blocker(DType grad, const std::function<void(Graph&, ValueId)>& extra = nullptr) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::zeros({4}, DType::f32));
  ValueId gv = g.input("g", {grad, {4}});
  ValueId w = g.apply1("cast", {gv}, {{"dtype", std::string("f32")}});
  if (extra) extra(g, w);
  g.apply("adam", {p, w});
  return grad_cast_fusion_blocker(g, g.num_nodes() - 1);
}

TEST(GradCastFusion, StandsBackWhereItMust) {
  EXPECT_EQ(blocker(DType::bf16), "");
  EXPECT_EQ(blocker(DType::f16), "");
  EXPECT_EQ(blocker(DType::f64), "the cast does not widen bf16 or f16");
  EXPECT_EQ(blocker(DType::bf16, [](Graph& g, ValueId w) { g.mark_output(w); }),
            "the gradient is a graph output or named (a run may fetch it)");
  EXPECT_EQ(blocker(DType::bf16, [](Graph& g, ValueId w) { g.mark_output(g.apply1("relu", {w})); }),
            "the gradient has another reader");
}

// The bf16-mixed float Llama: the 15 weight gradients of its bf16 GEMMs (7 a layer and the
// lm_head) reach Adam in bf16, and training is bit for bit the same.
TEST(GradCastFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_grad_cast", Device::cpu()), 2 * 7 + 1);
}

TEST(GradCastFusion, GpuMixedPrecisionLlamaTrainsBitForBitTheSame) {
  QG_REQUIRE_GPU();
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_grad_cast", Device::cuda()), 2 * 7 + 1);
}

}  // namespace
}  // namespace qg
