// `qat steps --floors` (apps/qat/steps_floors.cpp): each node's FLOPs and bytes, and the floor
// they give at the device's peaks, hand-checked.
#include <gtest/gtest.h>

#include "apps/qat/steps_floors.h"

namespace qg::cli {
namespace {

const Node& last_node(const Graph& g) {
  return g.node(static_cast<NodeId>(g.num_nodes() - 1));
}

// The 207M Llama of bench/torch_llama_qat_bench.py: 207,119,360 parameters (embedding and
// lm_head 2 x 32000 x 1024; per layer q, o 1024^2, k, v 1024 x 512, gate/up/down 1024 x 2816,
// two norms; the final norm), batch 8 x 1024: 6 N T = 10,180,330,782,720 and the attention
// 6 x 2 x 12 x 8 x 1024^3 / 2 = 618,475,290,624 (the 10.8 TFLOP the results' MFU uses).
TEST(StepsFloors, LlamaModelFlopsAreSixNtPlusCausalAttention) {
  const int64_t n = 2 * 32000 * 1024 +
                    12 * (2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 2816 + 2 * 1024) + 1024;
  ASSERT_EQ(n, 207119360);
  EXPECT_EQ(llama_model_flops(n, 12, 8, 1024, 1024), 10798806073344.0);
  EXPECT_EQ(llama_model_flops(10, 1, 1, 4, 2), 6.0 * 10 * 4 + 6.0 * 2 * 4 * 4 * 2 / 2);
}

TEST(StepsFloors, MatmulIsTwoMnkAndItsOperandBytes) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {4, 3}});
  ValueId b = g.input("b", {DType::f32, {3, 5}});
  g.apply1("matmul", {a, b});
  NodeCost c = node_cost(g, last_node(g));
  EXPECT_EQ(c.flops, 2.0 * 4 * 5 * 3);
  EXPECT_EQ(c.flops_16bit, 0.0);  // f32: the f32 rate
  EXPECT_EQ(c.bytes, (12 + 15 + 20) * 4.0);
  // a^T: K is a's first axis.
  Graph t;
  ValueId at = t.input("a", {DType::bf16, {3, 4}});
  ValueId bt = t.input("b", {DType::bf16, {3, 5}});
  t.apply1("matmul", {at, bt}, {{"transpose_a", true}});
  NodeCost ct = node_cost(t, last_node(t));
  EXPECT_EQ(ct.flops, 120.0);
  EXPECT_EQ(ct.flops_16bit, 120.0);
  EXPECT_EQ(ct.bytes, (12 + 15 + 20) * 2.0);
}

TEST(StepsFloors, CausalAttentionCountsTheCausalHalf) {
  Graph g;
  const TensorType q{DType::bf16, {1, 2, 8, 4}}, kv{DType::bf16, {1, 1, 8, 4}};
  std::vector<ValueId> o =
      g.apply("causal_attention", {g.input("q", q), g.input("k", kv), g.input("v", kv)});
  NodeCost c = node_cost(g, last_node(g));
  // QK^T and PV: 2 x 2 B H T T D / 2 = 2 * 64 * 8.
  EXPECT_EQ(c.flops, 1024.0);
  EXPECT_EQ(c.flops_16bit, 1024.0);
  // q 64, k 32, v 32, o 64 bf16 values; lse 16 f32.
  EXPECT_EQ(c.bytes, (64 + 32 + 32 + 64) * 2.0 + 16 * 4.0);
  (void)o;
}

TEST(StepsFloors, Int8GemmIsTwoMnkAtTheInt8RateAndReadsOnlyItsCodes) {
  Graph g;
  std::vector<ValueId> in = {
      g.input("x", {DType::bf16, {4, 64}}), g.input("w", {DType::bf16, {5, 64}}),
      g.input("a", {DType::i8, {4, 64}}),   g.input("sa", {DType::f32, {4}}),
      g.input("za", {DType::i32, {4}}),     g.input("wc", {DType::i8, {5, 64}}),
      g.input("sw", {DType::f32, {5, 2}})};
  g.apply1("int8_matmul_ste", in, {{"group_size", 32}});
  NodeCost c = node_cost(g, last_node(g));
  EXPECT_EQ(c.flops, 2.0 * 4 * 5 * 64);
  EXPECT_EQ(c.flops_int8, c.flops);
  EXPECT_EQ(c.flops_16bit, 0.0);
  // Codes 256 + 320 bytes, a_scale and a_zero 4 x 4 each, w_scale 10 x 4, y 20 bf16; not x, w.
  EXPECT_EQ(c.bytes, 256 + 320 + 16 + 16 + 40 + 20 * 2.0);
  DevicePeaks p;
  p.tops_int8 = 2000;
  p.gbps = 1e9;  // memory out of the way
  NodeCost big{4e12, 0, 0, 4e12};
  EXPECT_DOUBLE_EQ(big.floor_ms(p), 2.0);
}

TEST(StepsFloors, FloorIsTheSlowerOfComputeAndMemory) {
  DevicePeaks p;
  p.tflops_16bit = 1000;
  p.tflops_f32 = 50;
  p.gbps = 2000;
  NodeCost gemm{2e12, 2e12, 1e9};  // 2 ms of compute, 0.5 ms of memory
  EXPECT_DOUBLE_EQ(gemm.floor_ms(p), 2.0);
  NodeCost copy{0, 0, 4e9};  // 2 ms of memory
  EXPECT_DOUBLE_EQ(copy.floor_ms(p), 2.0);
  NodeCost f32{1e11, 0, 0};  // 2 ms at 50 TFLOP/s
  EXPECT_DOUBLE_EQ(f32.floor_ms(p), 2.0);
}

}  // namespace
}  // namespace qg::cli
