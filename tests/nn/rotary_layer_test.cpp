// The rotary layer: positions 0..seq-1 by default (a constant shared by the batch), given
// position ids otherwise, both against the rope op; rope_theta passed through; a bad input
// named by layer.
#include <gtest/gtest.h>

#include "nn/builder.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

TEST(RotaryLayer, DefaultsToPositionsZeroToSeq) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId q = g.input("q", {DType::f32, {2, 4, 5, 8}});
  ValueId y = b.rotary(q, "block0.attn.q_rope", 5e5);
  EXPECT_TRUE(b.parameters().empty());
  Executor ex(g);
  Tensor qv = testing::random_f32({2, 4, 5, 8}, 9);
  Tensor steps = Tensor::from_vector<int64_t>({1, 5}, {0, 1, 2, 3, 4});
  Tensor want = run_op(Device::cpu(), "rope", {qv, steps}, {{"rope_theta", 5e5}})[0];
  EXPECT_TRUE(same_bits(ex.run({{"q", qv}}, {y})[0], want));
  Tensor other = run_op(Device::cpu(), "rope", {qv, steps}, {{"rope_theta", 1e4}})[0];
  EXPECT_FALSE(same_bits(want, other));  // the theta reached the op
}

TEST(RotaryLayer, UsesGivenPositionIds) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId k = g.input("k", {DType::f32, {2, 2, 3, 4}});
  ValueId pos = g.input("pos", {DType::i64, {2, 3}});
  ValueId y = b.rotary(k, "block0.attn.k_rope", 1e4, pos);
  Executor ex(g);
  Tensor kv = testing::random_f32({2, 2, 3, 4}, 4);
  Tensor pv = Tensor::from_vector<int64_t>({2, 3}, {7, 8, 9, 0, 100, 3});
  Tensor want = run_op(Device::cpu(), "rope", {kv, pv}, {{"rope_theta", 1e4}})[0];
  EXPECT_TRUE(same_bits(ex.run({{"k", kv}, {"pos", pv}}, {y})[0], want));
}

TEST(RotaryLayer, NonHeadShapedInputIsANamedError) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 5, 32}});
  expect_error(
      [&] { b.rotary(x, "block3.attn.q_rope"); },
      {"nn.rotary", "block3.attn.q_rope", "[batch, heads, seq, head_dim]", "f32[2, 5, 32]"});
}

}  // namespace
}  // namespace qg
