// The CUDA kernels of fused_ste_producer (permute / transpose / same-shape add + ste_backward in
// one pass) against the same graph run unfused on the GPU and against the CPU, bit for bit:
// every route of the permute kernel (packs of 8 as in attention's head merge, the tile
// transpose, the per-element gather), adds of whole and partial mask bytes, f32, f64, bf16 and
// f16, random mask bytes, NaN (both signs), infinities and signed zeros in the data. Then the
// transformer QAT step trains identically on the GPU with and without the pass. Skips without
// a GPU.
#include <gtest/gtest.h>

#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_producer_graphs.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::NanRule;
using testing::ProducerCase;

const PassOptions kUnfused{{"fuse_ste_producer"}};

class SteProducerFusionCuda : public ::testing::TestWithParam<ProducerCase> {};

TEST_P(SteProducerFusionCuda, FusedKernelEqualsUnfusedKernelsAndTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const ProducerCase& c = GetParam();
  Graph plain, fused, ref;
  testing::build_producer_ste(plain, c);
  testing::build_producer_ste(fused, c);
  testing::build_producer_ste(ref, c);
  optimize(plain, kUnfused);
  optimize(fused, PassOptions{});
  optimize(ref, PassOptions{{"all"}});
  ASSERT_EQ(count_nodes(fused, "fused_ste_producer"), 1);
  ASSERT_EQ(count_nodes(plain, "ste_backward"), 1);
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(ref);
  for (uint64_t step = 0; step < 2; ++step) {
    const Executor::Feeds feeds = testing::producer_feeds(c, 10 * step + 1);
    Tensor a = ep.run(feeds, {plain.at("dx")})[0];
    Tensor b = ef.run(feeds, {fused.at("dx")})[0];
    Tensor r = cpu.run(feeds, {ref.at("dx")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "step " << step;
    // An add of a NaN gives the GPU's canonical NaN where the CPU keeps an operand's payload
    // (as the plain add does: tests/gpu/arith_broadcast_gpu_test.cpp); a permute moves bits.
    const NanRule nan = c.producer == "add" ? NanRule::any_payload : NanRule::same_bytes;
    EXPECT_EQ(first_difference(r, b, nan), "") << "against the CPU, step " << step;
  }
}

std::vector<ProducerCase> all_cases() {
  std::vector<ProducerCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (const ProducerCase& c : testing::producer_cases(t)) out.push_back(c);
  // Attention's head merge at a larger scale: [B, H, S, D] = [2, 12, 64, 64], several blocks.
  for (DType t : {DType::f32, DType::bf16})
    out.push_back({"permute", t, {2, 12, 64, 64}, {0, 2, 1, 3}, {{2, 64, 768}}});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Producers, SteProducerFusionCuda, ::testing::ValuesIn(all_cases()));

// Relies on every other kernel of the step being deterministic run to run on the GPU (the
// crosscheck holds them bit for bit to the CPU), so any difference is the fused nodes'.
TEST(SteProducerFusionCudaTransformer, TrainsIdenticallyWithAndWithoutThePass) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  testing::TransformerStep plain, fused;
  testing::build_transformer_step(plain);
  testing::build_transformer_step(fused);
  optimize(plain.g, kUnfused);
  optimize(fused.g, PassOptions{});
  ASSERT_EQ(count_nodes(fused.g, "fused_ste_producer"), 4);
  testing::expect_trains_identically(plain, fused, Device::cuda());
}

}  // namespace
}  // namespace qg
