// The fuse_cast_add pass (ops/fused/cast_add/): an f32 add whose operands come from widening
// casts (bf16/f16 -> f32), possibly through reshape views, becomes one fused_cast_add node
// that reads the narrow operands. Its output equals the unfused graph's bit for bit on the CPU
// and on the GPU (NaN of both signs, infinities, signed zeros and subnormals in the data;
// sizes that are and are not multiples of the kernel's packs of 8), and the GPU's equals the
// CPU's (a NaN's payload aside, as for the plain add). The pass stands back where it must,
// the fused node's kernel rejects bad inputs with a qg::Error, and the bf16-mixed Llama trains
// bit for bit the same with and without the pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/fused/cast_add/cast_add.h"
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
using testing::NanRule;

const PassOptions kUnfused{{"fuse_cast_add"}};

// One operand of the add: its dtype before the (optional) widening cast, and the shape it has
// there (a reshape view to the add's shape follows when it differs).
struct Operand {
  DType dtype;
  Shape shape;
};

struct CastAddCase {
  std::string label;
  Operand a, b;
  Shape out;
};

std::ostream& operator<<(std::ostream& os, const CastAddCase& c) {
  return os << c.label;
}

ValueId operand(Graph& g, const std::string& name, const Operand& o, const Shape& out) {
  ValueId v = g.input(name, {o.dtype, o.shape});
  if (o.dtype != DType::f32) v = g.apply1("cast", {v}, {{"dtype", std::string("f32")}});
  if (o.shape != out) v = g.apply1("reshape", {v}, {{"shape", out}});
  return v;
}

void build(Graph& g, const CastAddCase& c) {
  ValueId y = g.apply1("add", {operand(g, "a", c.a, c.out), operand(g, "b", c.b, c.out)});
  g.set_name(y, "y");
  g.mark_output(y);
}

// Random values with the edge cases planted at every 5th element from `first`: NaN of both
// signs, infinities, signed zeros, an f32 subnormal (which a 16-bit operand cannot hold: it
// becomes 0 there). a and b plant at different elements: which payload the sum of two NaNs
// keeps is unspecified (the compiler may swap an add's operands), the sum of a NaN and a
// number keeps the NaN's.
Tensor operand_data(const Operand& o, uint32_t seed, int64_t first) {
  Tensor t = testing::random_f32(o.shape, seed);
  float* p = t.data<float>();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            1e-40f};
  for (int64_t i = first; i < t.numel(); i += 5) p[i] = specials[(i / 5 + seed) % 7];
  return o.dtype == DType::f32 ? t : t.cast(o.dtype);
}

Executor::Feeds feeds(const CastAddCase& c, uint32_t seed) {
  return {{"a", operand_data(c.a, seed, 0)}, {"b", operand_data(c.b, seed + 1, 2)}};
}

int rewrites(const std::vector<PassRecord>& records) {
  for (const PassRecord& r : records)
    if (r.name == "fuse_cast_add") return r.rewrites;
  return -1;
}

class CastAddFusion : public ::testing::TestWithParam<CastAddCase> {};

TEST_P(CastAddFusion, FusedNodeEqualsUnfusedGraphBitForBit) {
  const CastAddCase& c = GetParam();
  Graph plain, fused;
  build(plain, c);
  build(fused, c);
  optimize(plain, kUnfused);
  EXPECT_EQ(rewrites(optimize(fused, PassOptions{})), 1);
  EXPECT_EQ(testing::count_live_ops(fused, "fused_cast_add"), 1);
  EXPECT_EQ(testing::count_live_ops(fused, "cast"), 0);
  EXPECT_EQ(testing::count_live_ops(fused, "reshape"), 0);
  EXPECT_EQ(testing::count_live_ops(fused, "add"), 0);
  EXPECT_EQ(testing::count_live_ops(plain, "add"), 1);
  Executor ep(plain), ef(fused);
  for (uint32_t seed : {1u, 11u}) {
    const Executor::Feeds in = feeds(c, seed);
    EXPECT_EQ(first_difference(ep.run(in, {plain.at("y")})[0], ef.run(in, {fused.at("y")})[0]), "")
        << "seed " << seed;
  }
}

TEST_P(CastAddFusion, GpuEqualsUnfusedGpuAndTheCpu) {
  QG_REQUIRE_GPU();
  const CastAddCase& c = GetParam();
  Graph plain, fused;
  build(plain, c);
  build(fused, c);
  optimize(plain, kUnfused);
  optimize(fused, PassOptions{});
  ASSERT_EQ(testing::count_live_ops(fused, "fused_cast_add"), 1);
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(fused);
  for (uint32_t seed : {1u, 11u}) {
    const Executor::Feeds in = feeds(c, seed);
    const Tensor a = ep.run(in, {plain.at("y")})[0], b = ef.run(in, {fused.at("y")})[0];
    EXPECT_EQ(first_difference(a, b), "") << "seed " << seed;
    // An add of a NaN gives the GPU's canonical NaN where the CPU keeps an operand's payload,
    // as the plain add does (tests/gpu/arith_broadcast_gpu_test.cpp).
    EXPECT_EQ(first_difference(cpu.run(in, {fused.at("y")})[0], b, NanRule::any_payload), "")
        << "against the CPU, seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Operands, CastAddFusion,
    ::testing::Values(
        CastAddCase{"bf16 through a reshape + f32",
                    {DType::bf16, {24, 8}},
                    {DType::f32, {4, 6, 8}},
                    {4, 6, 8}},
        CastAddCase{"f32 + f16", {DType::f32, {4, 6, 8}}, {DType::f16, {4, 6, 8}}, {4, 6, 8}},
        CastAddCase{"bf16 + bf16, both through reshapes",
                    {DType::bf16, {24, 8}},
                    {DType::bf16, {24, 8}},
                    {4, 6, 8}},
        CastAddCase{"bf16 + f16, 105 elements",
                    {DType::bf16, {3, 5, 7}},
                    {DType::f16, {3, 5, 7}},
                    {3, 5, 7}},
        CastAddCase{
            "f32 + bf16, 4100 elements", {DType::f32, {4100}}, {DType::bf16, {41, 100}}, {4100}}),
    [](const ::testing::TestParamInfo<CastAddCase>& info) {
      std::string name;
      for (char ch : info.param.label)
        if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
      return name;
    });

// bf16 a -> cast -> reshape -> add(., b f32); `tweak` changes the graph before the check.
std::string blocker_of(const std::function<ValueId(Graph&, ValueId /*widened*/)>& make_add) {
  Graph g;
  ValueId a = g.input("a", {DType::bf16, {4, 8}});
  ValueId w = g.apply1("cast", {a}, {{"dtype", std::string("f32")}});
  ValueId y = make_add(g, w);
  g.mark_output(y);
  return cast_add_fusion_blocker(g, g.value(y).producer);
}

TEST(CastAddFusionLegality, StandsBackWhereItMust) {
  EXPECT_EQ(blocker_of([](Graph& g, ValueId w) {
              return g.apply1("add", {w, g.input("b", {DType::f32, {4, 8}})});
            }),
            "");
  // The widened copy has a second reader: it must be written anyway.
  EXPECT_EQ(blocker_of([](Graph& g, ValueId w) {
              g.mark_output(g.apply1("relu", {w}));
              return g.apply1("add", {w, g.input("b", {DType::f32, {4, 8}})});
            }),
            "no operand is a widening cast's output read by the add alone");
  // A fetchable (output) widened copy.
  EXPECT_EQ(blocker_of([](Graph& g, ValueId w) {
              g.mark_output(w);
              return g.apply1("add", {w, g.input("b", {DType::f32, {4, 8}})});
            }),
            "no operand is a widening cast's output read by the add alone");
  // A broadcasting add: the fused kernel reads both operands element by element.
  EXPECT_EQ(blocker_of([](Graph& g, ValueId w) {
              return g.apply1("add", {w, g.input("b", {DType::f32, {8}})});
            }),
            "the add broadcasts (f32[8] into f32[4, 8])");
  EXPECT_EQ(blocker_of([](Graph& g, ValueId w) {
              return g.apply1("add", {w, w});
            }),
            "the add reads one value twice");
  // A narrowing cast feeding a bf16 add.
  {
    Graph g;
    ValueId a = g.input("a", {DType::f32, {4, 8}});
    ValueId n = g.apply1("cast", {a}, {{"dtype", std::string("bf16")}});
    ValueId y = g.apply1("add", {n, g.input("b", {DType::bf16, {4, 8}})});
    EXPECT_EQ(cast_add_fusion_blocker(g, g.value(y).producer), "the add is not f32");
  }
  // An f64 widening (f32 -> f64) is not this fusion's.
  {
    Graph g;
    ValueId a = g.input("a", {DType::f32, {4, 8}});
    ValueId w = g.apply1("cast", {a}, {{"dtype", std::string("f64")}});
    ValueId y = g.apply1("add", {w, g.input("b", {DType::f64, {4, 8}})});
    EXPECT_EQ(cast_add_fusion_blocker(g, g.value(y).producer), "the add is not f32");
  }
}

TEST(CastAddFusionErrors, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  testing::expect_error(
      [&] {
        g.apply("fused_cast_add", {a, a});
      },
      {"fused_cast_add", "fuse_cast_add pass"});
}

// Hand-built fused nodes (the pass never builds these): each bad input is a qg::Error from the
// kernel's check naming the op and what is wrong, not an out-of-bounds read.
TEST(CastAddFusionErrors, KernelRejectsBadInputs) {
  struct Bad {
    std::string label, expect;
    TensorType a, b, y;
  };
  const std::vector<Bad> cases = {
      // (a bad dtype is given as b: the executor picks a kernel by a's dtype, and refuses an
      // a of another dtype itself)
      {"an i32 operand",
       "must be f32, bf16 or f16",
       {DType::f32, {8}},
       {DType::i32, {8}},
       {DType::f32, {8}}},
      {"an f64 operand",
       "must be f32, bf16 or f16",
       {DType::bf16, {8}},
       {DType::f64, {8}},
       {DType::f32, {8}}},
      {"7 elements for 8",
       "does not broadcast",
       {DType::bf16, {7}},
       {DType::f32, {8}},
       {DType::f32, {8}}},
      {"a bf16 output",
       "contiguous f32",
       {DType::bf16, {8}},
       {DType::f32, {8}},
       {DType::bf16, {8}}},
  };
  for (const Bad& c : cases) {
    Graph g;
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_cast_add");
    fused.name = "bad";
    fused.inputs = {g.input("a", c.a), g.input("b", c.b)};
    const ValueId y = g.node(g.add_raw_node(fused, {c.y})).outputs[0];
    const Executor::Feeds in = {{"a", Tensor::zeros(c.a.shape, c.a.dtype)},
                                {"b", Tensor::zeros(c.b.shape, c.b.dtype)}};
    testing::expect_error([&] { Executor(g).run(in, {y}); }, {"fused_cast_add", c.expect});
  }
}

// The bf16-mixed float Llama: per layer the two residual adds (attention and MLP outputs
// widened) and three gradient sums (gate + up, q + k, then + v: each a widened bf16 GEMM
// result) fuse, and training is bit for bit the same.
TEST(CastAddFusionLlama, MixedPrecisionTrainsBitForBitTheSame) {
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_cast_add", Device::cpu()), 2 * 5);
}

}  // namespace
}  // namespace qg
