// dynamic_fake_quantize's out_dtype (y narrowed from an f32 x to bf16/f16) and the fuse_dfq_cast
// pass that makes it from a dynamic_fake_quantize -> cast chain: y equals the cast of the f32
// fake-quant bit for bit (CPU and GPU, integer and float-zero modes, partial-word groups), the
// gradient is the cast-back masked as before, the pass leaves training bit for bit unchanged
// (a small GEMM model and the bf16-mixed 8da4w Llama), it stands back where it must, and bad
// out_dtype uses are named errors.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "nn/qconfig.h"
#include "ops/dynamic_fake_quantize/dfq_cast_fusion.h"
#include "runtime/compile.h"
#include "runtime/passes/pass.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

Attrs with_out(Attrs a, const char* to) {
  a.set("out_dtype", std::string(to));
  return a;
}

const std::vector<Attrs>& modes() {
  static const std::vector<Attrs> m = {
      {{"quant_min", -128}, {"quant_max", 127}},
      {{"quant_min", -8}, {"quant_max", 7}, {"group_size", 32}, {"mode", std::string("symmetric")}},
      {{"quant_min", -8}, {"quant_max", 7}, {"group_size", 3}, {"mode", std::string("symmetric")}},
      {{"quant_min", 0},
       {"quant_max", 15},
       {"group_size", 32},
       {"mode", std::string("float_zero")},
       {"qparam_dtype", std::string("bf16")},
       {"eps", 1e-6}}};
  return m;
}

// y (out_dtype) = cast(y (f32)) bit for bit; the mask and qparams are those of the f32 op.
void expect_equals_cast(Device device) {
  uint32_t seed = 7;
  for (const Attrs& mode : modes())
    for (const char* to : {"bf16", "f16"})
      for (const Shape& shape : {Shape{6, 96}, Shape{3, 2, 384}}) {
        SCOPED_TRACE(mode.str() + " -> " + to);
        Tensor x = testing::random_f32(shape, seed++);
        auto plain = run_op(device, "dynamic_fake_quantize", {x}, mode);
        auto narrow = run_op(device, "dynamic_fake_quantize", {x}, with_out(mode, to));
        auto cast = run_op(device, "cast", {plain[0]}, {{"dtype", std::string(to)}});
        EXPECT_TRUE(same_bits(narrow[0], cast[0]));
        for (size_t k = 1; k < plain.size(); ++k) EXPECT_TRUE(same_bits(narrow[k], plain[k])) << k;
      }
}

TEST(DynamicFakeQuantizeOutDtype, EqualsTheCastOfTheF32Result) {
  expect_equals_cast(Device::cpu());
}

TEST(DynamicFakeQuantizeOutDtype, GpuEqualsTheCastOfTheF32Result) {
  QG_REQUIRE_GPU();
  expect_equals_cast(Device::cuda());
}

// dx = cast(dy to f32) where the code is in range, else 0: what dfq -> cast's backward gives.
TEST(DynamicFakeQuantizeOutDtype, GradientIsTheMaskedCastBack) {
  for (const Attrs& mode : modes()) {
    SCOPED_TRACE(mode.str());
    auto dx_of = [&](bool narrow) {
      Graph g;
      ValueId x = g.input("x", {DType::f32, {4, 96}});
      ValueId y = narrow ? g.apply("dynamic_fake_quantize", {x}, with_out(mode, "bf16"))[0]
                         : g.apply1("cast", {g.apply("dynamic_fake_quantize", {x}, mode)[0]},
                                    {{"dtype", std::string("bf16")}});
      ValueId w = g.input("w", {DType::bf16, {4, 96}});
      ValueId loss = g.apply1(
          "sum", {g.apply1("cast", {g.apply1("mul", {y, w})}, {{"dtype", std::string("f32")}})});
      ValueId dx = grad(g, loss, {x})[0];
      Executor ex(g, Device::cpu());
      Tensor xv = testing::random_f32({4, 96}, 3);
      Tensor wv = testing::random_f32({4, 96}, 4).cast(DType::bf16);
      return ex.run({{"x", xv}, {"w", wv}}, {dx})[0];
    };
    const Tensor fused = dx_of(true), plain = dx_of(false);
    EXPECT_EQ(fused.dtype(), DType::f32);
    EXPECT_TRUE(same_bits(fused, plain));
  }
}

TEST(DynamicFakeQuantizeOutDtype, BadUsesAreNamedErrors) {
  const Attrs mode = modes()[0];
  for (DType d : {DType::bf16, DType::f64}) {
    Tensor x = testing::random_f32({2, 8}, 1).cast(d);
    expect_error(
        [&] { run_op(Device::cpu(), "dynamic_fake_quantize", {x}, with_out(mode, "f16")); },
        {"dynamic_fake_quantize", "out_dtype", "narrows an f32 x only", dtype_name(d)});
  }
  Tensor x = testing::random_f32({2, 8}, 1);
  expect_error([&] { run_op(Device::cpu(), "dynamic_fake_quantize", {x}, with_out(mode, "i8")); },
               {"dynamic_fake_quantize", "out_dtype", "i8"});
}

// A linear in bf16 with a fake-quantized f32 weight: w -> dfq -> cast -> matmul; Adam steps.
struct GemmModel {
  Graph g;
  ValueId loss = kNoValue, y = kNoValue;
  std::vector<ValueId> params;
  NodeId cast = -1;
};

void build_gemm(GemmModel& m, bool fetch_y, bool second_reader) {
  Graph& g = m.g;
  ValueId x = g.input("x", {DType::bf16, {8, 64}});
  ValueId w = g.parameter("w", testing::random_f32({32, 64}, 11));
  auto q = g.apply("dynamic_fake_quantize", {w}, modes()[1], "w.dfq");
  m.y = q[0];
  ValueId w16 = g.apply1("cast", {q[0]}, {{"dtype", std::string("bf16")}}, "w.cast");
  m.cast = g.value(w16).producer;
  ValueId out = g.apply1("matmul", {x, w16}, {{"transpose_b", true}});
  ValueId loss32 = g.apply1("cast", {out}, {{"dtype", std::string("f32")}});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {loss32, loss32})});
  if (second_reader) loss = g.apply1("add", {loss, g.apply1("sum", {q[0]})});
  if (fetch_y) g.mark_output(q[0]);
  m.loss = loss;
  m.params = {w};
}

std::vector<Tensor> train(bool fuse, PassRecord* record = nullptr) {
  GemmModel m;
  build_gemm(m, false, false);
  CompileOptions options;
  if (!fuse) options.passes.disabled.insert("fuse_dfq_cast");
  CompiledStep step(m.g, {m.loss, m.params, nn::optimizer_nodes({"adam", 1e-2}), {}}, options);
  Tensor x = testing::random_f32({8, 64}, 12).cast(DType::bf16);
  std::vector<Tensor> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(step.train({{"x", x}}, {m.loss})[0]);
  step.synchronize();
  for (const PassRecord& r : step.passes())
    if (r.name == "fuse_dfq_cast" && record) *record = r;
  // Every state (the weight, Adam's moments), keyed by node names as built: in the same order.
  for (const auto& [key, t] : state_index(step.executor())) losses.push_back(t->to(Device::cpu()));
  return losses;
}

TEST(DfqCastFusion, TrainingIsBitForBitTheUnfusedOne) {
  PassRecord record;
  const std::vector<Tensor> fused = train(true, &record), plain = train(false);
  EXPECT_TRUE(record.ran);
  EXPECT_EQ(record.rewrites, 1);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(same_bits(fused[i], plain[i])) << i;
}

TEST(DfqCastFusion, StandsBackWhereItMust) {
  {
    GemmModel m;
    build_gemm(m, true, false);
    EXPECT_EQ(dfq_cast_fusion_blocker(m.g, m.cast),
              "y is a graph output or named (a run may fetch it)");
  }
  {
    GemmModel m;
    build_gemm(m, false, true);
    EXPECT_EQ(dfq_cast_fusion_blocker(m.g, m.cast), "y has another reader");
  }
  {
    Graph g;  // a bf16 x: the fused op would round twice
    ValueId x = g.input("x", {DType::bf16, {4, 32}});
    ValueId y = g.apply("dynamic_fake_quantize", {x}, modes()[0])[0];
    ValueId z = g.apply1("cast", {y}, {{"dtype", std::string("f16")}});
    EXPECT_EQ(dfq_cast_fusion_blocker(g, g.value(z).producer), "x is not f32");
  }
  {
    Graph g;  // a widening cast
    ValueId x = g.input("x", {DType::f32, {4, 32}});
    ValueId y = g.apply("dynamic_fake_quantize", {x}, modes()[0])[0];
    ValueId z = g.apply1("cast", {y}, {{"dtype", std::string("f64")}});
    EXPECT_EQ(dfq_cast_fusion_blocker(g, g.value(z).producer),
              "the cast does not narrow to bf16 or f16");
  }
}

// The bf16-mixed 8da4w Llama: every quantized weight's cast is fused (q, k, v, o, gate, up,
// down per layer and the lm_head), and its losses and states after Adam steps are bit for bit
// those with the pass off.
TEST(DfqCastFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  const nn::LlamaConfig config = nn::parse_llama_config(
      R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
          "max_position_embeddings": 16, "tie_word_embeddings": false})",
      "tiny");
  auto run = [&](bool fuse, int* rewrites) {
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, config, 2, 7, nn::parse_recipe("8da4w", 32), 5,
                                       nn::parse_precision("bf16-mixed"));
    CompileOptions options;
    if (!fuse) options.passes.disabled.insert("fuse_dfq_cast");
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, options);
    std::vector<Tensor> out;
    for (int s = 0; s < 3; ++s) out.push_back(step.train(testing::tiny_llama_feeds(), {m.loss})[0]);
    step.synchronize();
    for (const PassRecord& r : step.passes())
      if (r.name == "fuse_dfq_cast") *rewrites = r.rewrites;
    for (const auto& [key, t] : state_index(step.executor())) out.push_back(t->to(Device::cpu()));
    return out;
  };
  int fused_rewrites = -1, plain_rewrites = -1;
  const std::vector<Tensor> fused = run(true, &fused_rewrites), plain = run(false, &plain_rewrites);
  // 15 weights, the lm_head's input quantizer (f32 final norm -> bf16 GEMM), and per layer the
  // shared q/k/v and gate/up input quantizers: their y is flattened before them
  // (nn/gemm_operand.cpp) and merge_duplicate_nodes leaves one cast of it, its only reader.
  EXPECT_EQ(fused_rewrites, 2 * 7 + 1 + 1 + 2 * 2);
  EXPECT_EQ(plain_rewrites, 0);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(same_bits(fused[i], plain[i])) << i;
}

}  // namespace
}  // namespace qg
