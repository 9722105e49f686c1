// The fuse_swiglu pass (ops/fused/swiglu/): silu(gate) * up and its backward (two muls and a
// silu_backward) become fused_swiglu and fused_swiglu_backward, whose outputs equal the unfused
// graph's bit for bit on the CPU and on the GPU (f32, bf16 and f16; NaN, infinities, signed
// zeros and large magnitudes in gate, up and the incoming gradient; sizes with and without a
// partial pack of 8). The pass stands back where it must, the fused kernels reject bad inputs
// with a qg::Error, and the bf16-mixed Llama trains bit for bit the same with and without it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/fused/swiglu/swiglu.h"
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

const PassOptions kUnfused{{"fuse_swiglu"}};

struct Built {
  Graph g;
  NodeId silu = -1;
};

// h = silu(gate) * up; loss = sum(f32(h * r)); fetches h and the gradients of gate and up.
void build(Built& b, DType dtype, const Shape& shape, bool fetch_s = false) {
  Graph& g = b.g;
  ValueId gate = g.input("gate", {dtype, shape});
  ValueId up = g.input("up", {dtype, shape});
  ValueId r = g.input("r", {dtype, shape});
  ValueId s = g.apply1("silu", {gate});
  b.silu = g.value(s).producer;
  if (fetch_s) g.mark_output(s);
  ValueId h = g.apply1("mul", {s, up});
  ValueId loss = g.apply1(
      "sum", {g.apply1("cast", {g.apply1("mul", {h, r})}, {{"dtype", std::string("f32")}})});
  std::vector<ValueId> d = grad(g, loss, {gate, up});
  const char* names[] = {"h", "dgate", "dup"};
  const ValueId values[] = {h, d[0], d[1]};
  for (int i = 0; i < 3; ++i) {
    g.set_name(values[i], names[i]);
    g.mark_output(values[i]);
  }
}

// The fetched values by name: a pass replaces them with its fused nodes' outputs.
std::vector<ValueId> fetches(const Graph& g) {
  return {g.at("h"), g.at("dgate"), g.at("dup")};
}

Tensor data(DType dtype, const Shape& shape, uint32_t seed, float scale) {
  Tensor t = testing::random_f32(shape, seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            0.0f,
                            30.0f,
                            -30.0f};
  for (int64_t i = seed % 3; i < t.numel(); i += 5) p[i] = specials[(i / 5 + seed) % 7];
  return t.cast(dtype);
}

Executor::Feeds feeds(DType dtype, const Shape& shape, uint32_t seed) {
  return {{"gate", data(dtype, shape, seed, 6.0f)},
          {"up", data(dtype, shape, seed + 1, 2.0f)},
          {"r", data(dtype, shape, seed + 2, 1.0f)}};
}

struct Case {
  DType dtype;
  Shape shape;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {{DType::f32, {3, 37}},
                                      {DType::bf16, {64, 8}},
                                      {DType::f16, {5, 21}},
                                      {DType::bf16, {2, 7, 130}}};
  return c;
}

void expect_fused_equals_unfused(Device device) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " " + shape_str(c.shape));
    Built plain, fused;
    build(plain, c.dtype, c.shape);
    build(fused, c.dtype, c.shape);
    optimize(plain.g, kUnfused);
    optimize(fused.g, PassOptions{});
    EXPECT_EQ(testing::count_live_ops(fused.g, "fused_swiglu"), 1);
    EXPECT_EQ(testing::count_live_ops(fused.g, "fused_swiglu_backward"), 1);
    EXPECT_EQ(testing::count_live_ops(fused.g, "silu"), 0);
    EXPECT_EQ(testing::count_live_ops(fused.g, "silu_backward"), 0);
    EXPECT_EQ(testing::count_live_ops(plain.g, "silu_backward"), 1);
    Executor ep(plain.g, device), ef(fused.g, device);
    for (uint32_t seed : {1u, 7u}) {
      const Executor::Feeds in = feeds(c.dtype, c.shape, seed);
      const std::vector<Tensor> a = ep.run(in, fetches(plain.g)), b = ef.run(in, fetches(fused.g));
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(first_difference(a[i], b[i]), "") << "output " << i << ", seed " << seed;
    }
  }
}

TEST(SwigluFusion, FusedNodesEqualUnfusedGraphBitForBit) {
  expect_fused_equals_unfused(Device::cpu());
}

// Against the unfused graph on the GPU (the CPU's libm exp differs from CUDA's expf by ulps,
// as for the plain silu: `qat crosscheck` compares those to rounding).
TEST(SwigluFusion, GpuFusedNodesEqualUnfusedGpuGraphBitForBit) {
  QG_REQUIRE_GPU();
  expect_fused_equals_unfused(Device::cuda());
}

TEST(SwigluFusion, StandsBackWhereItMust) {
  {
    Built b;
    build(b, DType::f32, {4, 8});
    EXPECT_EQ(swiglu_fusion_blocker(b.g, b.silu), "");
  }
  {
    Built b;
    build(b, DType::f32, {4, 8}, /*fetch_s=*/true);
    EXPECT_EQ(swiglu_fusion_blocker(b.g, b.silu),
              "s is a graph output or named (a run may fetch it)");
  }
  {
    Graph g;  // forward only: no backward reads s
    ValueId s = g.apply1("silu", {g.input("gate", {DType::f32, {4, 8}})});
    g.mark_output(g.apply1("mul", {s, g.input("up", {DType::f32, {4, 8}})}));
    EXPECT_EQ(swiglu_fusion_blocker(g, g.value(s).producer), "no backward mul(dh, s) reads s");
  }
  {
    Graph g;  // s read by another op
    ValueId s = g.apply1("silu", {g.input("gate", {DType::f32, {4, 8}})});
    g.mark_output(g.apply1("relu", {s}));
    EXPECT_EQ(swiglu_fusion_blocker(g, g.value(s).producer), "s is read by relu");
  }
}

TEST(SwigluFusion, FusedNodesCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  testing::expect_error(
      [&] {
        g.apply("fused_swiglu", {a, a});
      },
      {"fused_swiglu", "fuse_swiglu pass"});
  testing::expect_error(
      [&] {
        g.apply("fused_swiglu_backward", {a, a, a});
      },
      {"fused_swiglu_backward", "fuse_swiglu pass"});
}

// Hand-built fused nodes (the pass never builds these): a bad input is a qg::Error naming the
// op and what is wrong.
TEST(SwigluFusion, KernelsRejectBadInputs) {
  struct Bad {
    std::string op, expect;
    std::vector<TensorType> inputs, outputs;
  };
  const TensorType f8{DType::f32, {8}};
  const std::vector<Bad> cases = {
      {"fused_swiglu", "input 1", {f8, {DType::f32, {7}}}, {f8}},
      {"fused_swiglu", "input 1", {f8, {DType::bf16, {8}}}, {f8}},
      {"fused_swiglu", "output 0", {f8, f8}, {{DType::f64, {8}}}},
      {"fused_swiglu_backward", "input 2", {f8, f8, {DType::f32, {9}}}, {f8, f8}},
      {"fused_swiglu_backward", "output 1", {f8, f8, f8}, {f8, {DType::f16, {8}}}},
  };
  for (const Bad& c : cases) {
    Graph g;
    Node fused;
    fused.op = &OpRegistry::instance().get(c.op);
    fused.name = "bad";
    Executor::Feeds in;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const std::string name = "x" + std::to_string(i);
      fused.inputs.push_back(g.input(name, c.inputs[i]));
      in[name] = Tensor::zeros(c.inputs[i].shape, c.inputs[i].dtype);
    }
    const NodeId id = g.add_raw_node(fused, c.outputs);
    SCOPED_TRACE(c.op + ": " + c.expect);
    testing::expect_error([&] { Executor(g).run(in, {g.node(id).outputs[0]}); }, {c.op, c.expect});
  }
}

// The bf16-mixed float Llama: each layer's SwiGLU fuses, and training is bit for bit the same.
TEST(SwigluFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_swiglu", Device::cpu()), 2);
}

TEST(SwigluFusion, GpuMixedPrecisionLlamaTrainsBitForBitTheSame) {
  QG_REQUIRE_GPU();
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_swiglu", Device::cuda()), 2);
}

}  // namespace
}  // namespace qg
