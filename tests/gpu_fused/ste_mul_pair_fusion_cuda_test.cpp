// The CUDA kernel of fused_ste_mul_pair (an ste_backward and the two muls reading its masked
// gradient, in one pass) against the same graph run unfused on the GPU, bit for bit, and
// against the CPU: f32, f64, bf16 and f16, both operand orders, through a reshape view or not,
// a partial last mask byte, random mask bytes, NaN (both signs), infinities and signed zeros
// in the data, and a shape of many blocks (a Llama MLP's [tokens, intermediate]). Then the
// bf16-mixed 8da4w Llama trains identically on the GPU with and without the pass. Skips
// without a GPU.
#include <gtest/gtest.h>

#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/ste_mul_pair_graphs.h"
#include "tests/common/ste_step_graphs.h"
#include "tests/common/tensor_compare.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::MulPairCase;
using testing::NanRule;

class SteMulPairFusionCuda : public ::testing::TestWithParam<MulPairCase> {};

TEST_P(SteMulPairFusionCuda, FusedKernelEqualsUnfusedKernelsAndTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const MulPairCase& c = GetParam();
  Graph plain, fused, ref;
  testing::build_mul_pair(plain, c);
  testing::build_mul_pair(fused, c);
  testing::build_mul_pair(ref, c);
  optimize(plain, PassOptions{{"fuse_ste_mul_pair"}});
  optimize(fused, PassOptions{});
  optimize(ref, PassOptions{{"all"}});
  ASSERT_EQ(count_nodes(fused, "fused_ste_mul_pair"), 1);
  ASSERT_EQ(count_nodes(plain, "mul"), 2);
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(ref);
  for (uint32_t seed : {1u, 11u}) {
    const Executor::Feeds feeds = testing::mul_pair_feeds(c, seed);
    const auto a = ep.run(feeds, {plain.at("ya"), plain.at("yb")});
    const auto b = ef.run(feeds, {fused.at("ya"), fused.at("yb")});
    const auto r = cpu.run(feeds, {ref.at("ya"), ref.at("yb")});
    for (int k = 0; k < 2; ++k) {
      // f64 only: a product of two NaNs keeps one operand's payload (and sign) on the GPU,
      // and which one depends on the operand order the compiler picked for each kernel
      // (measured on an H200: "-nan vs nan"); f32 and the 16-bit types give the canonical
      // NaN, so they are compared bit for bit.
      const NanRule gpu_rule = c.dtype == DType::f64 ? NanRule::any_payload : NanRule::same_bytes;
      EXPECT_EQ(first_difference(a[k], b[k], gpu_rule), "") << "output " << k << ", seed " << seed;
      // A product with a NaN operand is the GPU's canonical NaN where the CPU keeps an
      // operand's payload, as the plain mul gives (tests/gpu/arith_broadcast_gpu_test.cpp).
      EXPECT_EQ(first_difference(r[k], b[k], NanRule::any_payload), "")
          << "against the CPU, output " << k << ", seed " << seed;
    }
  }
}

std::vector<MulPairCase> all_cases() {
  std::vector<MulPairCase> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool reshape : {true, false}) out.push_back({t, 6, 13, reshape});
  for (DType t : {DType::f32, DType::bf16}) out.push_back({t, 64, 2816, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(DTypes, SteMulPairFusionCuda, ::testing::ValuesIn(all_cases()));

// Three Adam steps of the bf16-mixed 8da4w Llama on the GPU, with and without the pass: the
// same losses and every state bit for bit.
TEST(SteMulPairFusionCudaLlama, TrainsBitForBitAsWithoutThePass) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  testing::expect_llama_trains_as_without_mul_pair(Device::cuda());
}

}  // namespace
}  // namespace qg
