// The CUDA kernels of fused_ste_optimizer (ste_backward + sgd/adam step) and fused_ste_chain
// (two ste_backward nodes) against the same graphs run unfused on the GPU, bit for bit: the
// parameter and optimizer state after several steps (f32, f64, per-tensor and per-channel
// masks, partial last mask bytes, more elements than the optimizer kernel's grid so its
// grid-stride loop turns), the two-mask gradient (every float dtype; also against the CPU,
// since it is a select without arithmetic), and the transformer QAT step of `qat steps`
// (losses and parameters over three steps). Skips without a GPU.
#include <gtest/gtest.h>

#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::special_data;
using testing::WeightCase;
using testing::WeightStep;

const PassOptions kUnfused{{"fuse_ste_optimizer", "fuse_ste_chain"}};

class SteOptimizerFusionCuda : public ::testing::TestWithParam<WeightCase> {};

TEST_P(SteOptimizerFusionCuda, FusedStepEqualsUnfusedStepOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const WeightCase& c = GetParam();
  WeightStep plain, fused;
  testing::build_weight_step(plain, c);
  testing::build_weight_step(fused, c);
  optimize(plain.g, kUnfused);
  ASSERT_EQ(optimize(fused.g, PassOptions{}).at(3).rewrites, 1);
  ASSERT_EQ(fused.g.node(fused.step).op->name, "fused_ste_optimizer");
  Executor ep(plain.g, Device::cuda()), ef(fused.g, Device::cuda());
  const Tensor init = ef.parameter("w").to(Device::cpu()).clone();
  for (uint64_t i = 0; i < 4; ++i) {
    Executor::Feeds feeds = {{"x", special_data(c.shape, c.dtype, 30 + i, 3.0)}};
    Tensor lp = ep.run(feeds, {plain.loss}, {plain.step})[0];
    Tensor lf = ef.run(feeds, {fused.loss}, {fused.step})[0];
    EXPECT_EQ(first_difference(lp, lf), "") << "loss, step " << i;
    EXPECT_EQ(first_difference(ep.parameter("w"), ef.parameter("w")), "") << "step " << i;
    const auto& sp = ep.states(plain.step);
    const auto& sf = ef.states(fused.step);
    ASSERT_EQ(sp.size(), sf.size());
    for (size_t k = 0; k < sp.size(); ++k)
      EXPECT_EQ(first_difference(sp[k], sf[k]), "") << "state " << k << ", step " << i;
  }
  EXPECT_NE(first_difference(init, ef.parameter("w")), "");
}

std::vector<WeightCase> weight_cases() {
  std::vector<WeightCase> out;
  nn::OptimizerConfig sgd_plain{"sgd", 0.05, 0.0};
  nn::OptimizerConfig sgd_momentum{"sgd", 0.05, 0.9};
  sgd_momentum.weight_decay = 0.01;
  nn::OptimizerConfig sgd_momentum_only{"sgd", 0.05, 0.9};
  nn::OptimizerConfig adam{"adam", 0.01};
  adam.weight_decay = 0.01;
  for (DType t : {DType::f32, DType::f64})
    for (bool per_channel : {false, true})
      for (const auto& o : {sgd_plain, sgd_momentum, sgd_momentum_only, adam})
        for (Shape s : {Shape{7, 9}, Shape{768, 1001}})  // 768*1001 > 1024 blocks * 256 threads
          out.push_back({t, per_channel, o, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Steps, SteOptimizerFusionCuda, ::testing::ValuesIn(weight_cases()));

struct ChainCase {
  DType dtype;
  bool per_channel;
  Shape shape;
};

void PrintTo(const ChainCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << (c.per_channel ? " per-channel" : " per-tensor")
      << " n=" << shape_numel(c.shape);
}

class SteChainFusionCuda : public ::testing::TestWithParam<ChainCase> {};

TEST_P(SteChainFusionCuda, TwoMaskKernelEqualsThePairOnTheGpuAndTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const ChainCase& c = GetParam();
  Graph plain, fused, ref;
  testing::build_double_quantize(plain, c.dtype, c.shape, c.per_channel);
  testing::build_double_quantize(fused, c.dtype, c.shape, c.per_channel);
  testing::build_double_quantize(ref, c.dtype, c.shape, c.per_channel);
  optimize(plain, kUnfused);
  ASSERT_EQ(optimize(fused, PassOptions{}).at(4).rewrites, 1);
  optimize(ref, PassOptions{{"all"}});
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(ref);
  for (uint64_t i = 0; i < 2; ++i) {
    Executor::Feeds feeds = {{"x", special_data(c.shape, c.dtype, 50 + i, 2.0)},
                             {"w", special_data(c.shape, c.dtype, 60 + i, 1.0)}};
    Tensor a = ep.run(feeds, {plain.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.at("dx")})[0];
    Tensor r = cpu.run(feeds, {ref.at("dx")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "step " << i;
    EXPECT_EQ(first_difference(r, b), "") << "against the CPU, step " << i;
  }
}

std::vector<ChainCase> chain_cases() {
  std::vector<ChainCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool per_channel : {false, true})
      for (Shape s : {Shape{3, 5}, Shape{64, 768}, Shape{257, 1001}})
        out.push_back({t, per_channel, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Masks, SteChainFusionCuda, ::testing::ValuesIn(chain_cases()));

// Relies on every other kernel of the step being deterministic run to run on the GPU (the
// crosscheck holds them bit for bit to the CPU), so any difference is the fused nodes'.
TEST(SteOptimizerFusionCudaTransformer, TrainsIdenticallyWithAndWithoutThePasses) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  testing::TransformerStep plain, fused;
  testing::build_transformer_step(plain);
  testing::build_transformer_step(fused);
  optimize(plain.g, kUnfused);
  optimize(fused.g, PassOptions{});
  ASSERT_EQ(count_nodes(fused.g, "fused_ste_optimizer"), 7);
  ASSERT_EQ(count_nodes(fused.g, "fused_ste_chain"), 1);
  testing::expect_trains_identically(plain, fused, Device::cuda());
}

}  // namespace
}  // namespace qg
