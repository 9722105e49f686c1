// Conversion of a trained Llama decoder to integer weights (nn::convert_to_integer): the
// converted model's logits equal the QAT model's eval-mode logits bit for bit on the CPU, for
// every recipe with integer weight codes and in f32 and bf16-mixed; no weight fake-quant and no
// float projection weight is left; int4 weight-only's float zero point converts for f32 master
// weights and is a named error on bf16 ones. On a GPU, the converted model's CUDA logits equal
// the QAT model's CUDA logits bit for bit too (the dequantize ops compute code * scale in f32
// as the fake-quant does; the GEMMs then read the same values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "nn/convert.h"
#include "nn/convert_float_zero.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "nn/qconfig.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

nn::LlamaConfig tiny_config() {
  return testing::tiny_llama_config(2);
}

// A model trained a few Adam steps (so its weights are not the initial ones), copied into a
// forward-only instance.
nn::LlamaInstance trained_instance(const nn::QConfig& qc, const nn::PrecisionPolicy& precision,
                                   Device device = Device::cpu()) {
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 5, precision);
  CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
  for (int s = 0; s < 4; ++s) step.train(testing::tiny_llama_feeds(), {m.loss});
  step.synchronize();
  nn::LlamaInstance inst = nn::build_llama_instance(tiny_config(), 2, 7, qc, device, precision);
  nn::copy_states(step.executor(), *inst.exec);
  return inst;
}

Tensor logits(nn::LlamaInstance& inst) {
  inst.exec->set_training(false);
  return inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
}

struct Case {
  std::string recipe;
  int group;
  const char* dequantize;  // the storage op each weight becomes
};

TEST(LlamaConvert, ConvertedLogitsEqualTheQatLogitsBitForBit) {
  const std::vector<Case> cases = {{"8da4w", 32, "int4_unpack_dequantize"},
                                   {"8da3w", 32, "int4_unpack_dequantize"},
                                   {"8da2w", 64, "int4_unpack_dequantize"},
                                   {"w8a8_dynamic", 32, "dequantize"},
                                   {"int4_weight_only", 32, "int4_unpack_dequantize"}};
  for (const Case& c : cases)
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
      SCOPED_TRACE(c.recipe + (precision.mixed() ? " bf16-mixed" : " f32"));
      const nn::QConfig qc = nn::parse_recipe(c.recipe, c.group);
      nn::LlamaInstance inst = trained_instance(qc, precision);
      const Tensor qat = logits(inst);
      const int64_t bytes = nn::convert_to_integer(inst, qc);
      const Tensor converted = logits(inst);
      ASSERT_EQ(qat.nbytes(), converted.nbytes());
      EXPECT_EQ(std::memcmp(qat.raw_data(), converted.raw_data(), qat.nbytes()), 0);
      // Every linear weight is now codes + its dequantize; no weight fake-quant and no float
      // projection weight feeds the logits.
      const Graph& g = *inst.graph;
      std::vector<bool> needed = g.needed_nodes({inst.model.logits});
      int dequantizers = 0;
      for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
        if (!needed[id]) continue;
        const Node& n = g.node(id);
        if (n.op->name == c.dequantize && n.name.find(".weight.int") != std::string::npos)
          ++dequantizers;
        if (n.op->name == "dynamic_fake_quantize") {
          EXPECT_EQ(n.name.find(".weight"), std::string::npos) << n.name;
        }
      }
      for (const nn::WeightQuantizer& w : inst.model.weights)
        EXPECT_FALSE(needed[g.value(w.source).producer]) << w.layer;
      EXPECT_EQ(dequantizers, static_cast<int>(inst.model.weights.size()));
      // Codes of <= 4 bits take half a byte per weight, int8 one: far below the f32 weights.
      int64_t weight_numel = 0;
      for (const nn::WeightQuantizer& w : inst.model.weights)
        weight_numel += shape_numel(g.value(w.quantized).type.shape);
      EXPECT_LT(bytes, 4 * weight_numel + 4 * 50 * 64 + 64 * 64);
    }
}

TEST(LlamaConvert, OnTheGpuConvertedLogitsEqualTheQatLogitsBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  for (const std::string recipe : {"8da4w", "w8a8_dynamic", "int4_weight_only"})
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
      SCOPED_TRACE(recipe + (precision.mixed() ? " bf16-mixed" : " f32"));
      const nn::QConfig qc = nn::parse_recipe(recipe, 32);
      nn::LlamaInstance inst = trained_instance(qc, precision, Device::cuda(0));
      const Tensor qat = logits(inst);
      nn::convert_to_integer(inst, qc);
      const Tensor converted = logits(inst);
      ASSERT_EQ(qat.nbytes(), converted.nbytes());
      EXPECT_EQ(std::memcmp(qat.raw_data(), converted.raw_data(), qat.nbytes()), 0);
    }
}

// The integer forward (QConfig::integer_forward): every projection's forward is
// int8_matmul_ste, and conversion leaves int8_matmul on constant codes.
nn::QConfig integer_forward(const std::string& recipe, int group) {
  nn::QConfig qc = nn::parse_recipe(recipe, group);
  qc.integer_forward = true;
  return qc;
}

int count_needed(const Graph& g, ValueId out, const std::string& op) {
  std::vector<bool> needed = g.needed_nodes({out});
  int n = 0;
  for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id)
    n += needed[id] && g.node(id).op->name == op;
  return n;
}

void expect_integer_forward_converts_bit_for_bit(Device device) {
  for (const auto& [recipe, group] :
       std::vector<std::pair<std::string, int>>{{"8da4w", 32}, {"8da2w", 64}, {"w8a8_dynamic", 32}})
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
      SCOPED_TRACE(recipe + (precision.mixed() ? " bf16-mixed" : " f32"));
      const nn::QConfig qc = integer_forward(recipe, group);
      nn::LlamaInstance inst = trained_instance(qc, precision, device);
      const Graph& g = *inst.graph;
      const int linears = static_cast<int>(inst.model.weights.size());
      EXPECT_EQ(count_needed(g, inst.model.logits, "int8_matmul_ste"), linears);
      EXPECT_EQ(count_needed(g, inst.model.logits, "matmul"), 0);
      const Tensor qat = logits(inst);
      nn::convert_to_integer(inst, qc);
      const Tensor converted = logits(inst);
      ASSERT_EQ(qat.nbytes(), converted.nbytes());
      EXPECT_EQ(std::memcmp(qat.raw_data(), converted.raw_data(), qat.nbytes()), 0);
      // Deployed: int8_matmul on constant codes; no weight quantizer, float weight or STE left.
      EXPECT_EQ(count_needed(g, inst.model.logits, "int8_matmul"), linears);
      EXPECT_EQ(count_needed(g, inst.model.logits, "int8_matmul_ste"), 0);
      // Codes of <= 4 bits are stored packed, two per byte.
      EXPECT_EQ(count_needed(g, inst.model.logits, "int4_unpack_dequantize"),
                recipe == "w8a8_dynamic" ? 0 : linears);
      for (const nn::WeightQuantizer& w : inst.model.weights)
        EXPECT_FALSE(g.needed_nodes({inst.model.logits})[g.value(w.source).producer]) << w.layer;
    }
}

TEST(LlamaConvert, IntegerForwardConvertedLogitsEqualTheQatLogitsBitForBit) {
  expect_integer_forward_converts_bit_for_bit(Device::cpu());
}

TEST(LlamaConvert, OnTheGpuIntegerForwardConvertedLogitsEqualTheQatLogitsBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  expect_integer_forward_converts_bit_for_bit(Device::cuda(0));
}

TEST(LlamaConvert, IntegerForwardIsTheFakeQuantForwardUpToFloatRounding) {
  // The same trained weights through both forwards. They differ only in float rounding: the
  // fake-quant GEMM sums products of dequantized operands (rounded to the compute dtype) in
  // another order than int8_matmul's exact per-group integer sums. The bound is relative to
  // the largest logit: f32 rounding over K <= 128 terms stays far below 1e-4; bf16-mixed
  // rounds each dequantized operand to 8 significant bits, so its bound is bf16's 2^-7 eps
  // with headroom.
  for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
    SCOPED_TRACE(precision.name());
    const nn::QConfig fq = nn::parse_recipe("8da4w", 32);
    nn::LlamaInstance a = trained_instance(fq, precision);
    nn::LlamaInstance b = nn::build_llama_instance(
        tiny_config(), 2, 7, integer_forward("8da4w", 32), Device::cpu(), precision);
    nn::copy_states(*a.exec, *b.exec);
    const Tensor la = logits(a), lb = logits(b);
    double max_abs = 0, max_diff = 0;
    for (int64_t i = 0; i < la.numel(); ++i) {
      max_abs = std::max(max_abs, std::abs(la.at(i)));
      max_diff = std::max(max_diff, std::abs(la.at(i) - lb.at(i)));
    }
    EXPECT_GT(max_diff, 0.0) << "the two forwards should not be the same arithmetic";
    EXPECT_LT(max_diff / max_abs, precision.mixed() ? 3e-2 : 1e-4);
  }
}

TEST(LlamaConvert, IntegerForwardTakesOnlyDynamicSymmetricIntegerRecipes) {
  for (const std::string recipe : {"int4_weight_only", "float"}) {
    nn::QConfig qc = nn::parse_recipe(recipe, 32);
    qc.integer_forward = true;
    testing::expect_error([&] { qc.validate(); }, {"[qconfig]", "integer forward"});
  }
  nn::QConfig learned = integer_forward("8da4w", 32);
  learned.learned_weight_ranges = true;
  testing::expect_error([&] { learned.validate(); }, {"[qconfig]", "learned ranges"});
}

TEST(LlamaConvert, FloatZeroCodesAreUnsignedNibblesWithTheGroupZeroAddedAfter) {
  // Hand-checked: one group of 32 weights 0, 0.5, ..., 15.5 has min 0 and max 15.5, so
  // scale = bf16(15.5 / 15) = 1.0312500, zero = bf16(0 + 8 * 1.03125) = 8.25 and the value of
  // code 0 is low = 8.25 - 8.25 = 0. Weight 15.5 -> rint(15.5 / 1.03125) = 15, weight 0.5 ->
  // rint(0.4848) = 0, weight 4 -> rint(3.8788) = 4; code q stands for (q - 8) * 1.03125 + 8.25.
  Graph g;
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = 0.5f * static_cast<float>(i);
  ValueId src = g.constant(Tensor::from_vector<float>({1, 32}, w), "l.weight");
  nn::QConfig qc = nn::parse_recipe("int4_weight_only", 32);
  const NodeId dfq = g.value(g.apply("dynamic_fake_quantize", {src},
                                     nn::dynamic_weight_attrs(qc, DType::f32), "l.wfq")[0])
                         .producer;
  nn::WeightQuantizer wq{"l", src, g.node(dfq).outputs[0], dfq, 2, -1};
  Executor ex(g, Device::cpu());
  std::vector<Tensor> got = ex.run({}, {src, g.node(dfq).outputs[2], g.node(dfq).outputs[3]});
  EXPECT_EQ(got[1].at(0), 1.03125);
  EXPECT_EQ(got[2].at(0), 8.25);
  ValueId rebuilt = nn::float_zero_integer_weight(g, wq, got);
  Executor ex2(g, Device::cpu());
  std::vector<Tensor> out = ex2.run({}, {rebuilt, g.node(dfq).outputs[0]});
  ASSERT_EQ(out[0].nbytes(), out[1].nbytes());
  EXPECT_EQ(std::memcmp(out[0].raw_data(), out[1].raw_data(), out[0].nbytes()), 0);
  EXPECT_EQ(out[0].at(31), (15 - 8) * 1.03125 + 8.25);  // 15.5 -> code 15
  EXPECT_EQ(out[0].at(1), (0 - 8) * 1.03125 + 8.25);    // 0.5 -> code 0
  EXPECT_EQ(out[0].at(8), (4 - 8) * 1.03125 + 8.25);    // 4 -> code 4
  // The packed nibbles, element 2i in the low half of byte i: codes 0, 0 | ... | 15, 15.
  for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id)
    if (g.node(id).name == "l.weight.int.codes") {
      const Tensor& bytes = g.node(id).value;
      ASSERT_EQ(bytes.numel(), 16);
      EXPECT_EQ(bytes.data<uint8_t>()[0], 0x00);
      EXPECT_EQ(bytes.data<uint8_t>()[4], 0x44);   // weights 4 and 4.5: codes 4 and 4
      EXPECT_EQ(bytes.data<uint8_t>()[15], 0xff);  // weights 15 and 15.5: codes 15 and 15
    }
}

TEST(LlamaConvert, FloatZeroPointOnBf16WeightsIsANamedError) {
  const nn::QConfig qc = nn::parse_recipe("int4_weight_only", 32);
  nn::LlamaInstance inst =
      nn::build_llama_instance(tiny_config(), 2, 7, qc, Device::cpu(), nn::parse_precision("bf16"));
  testing::expect_error([&] { nn::convert_to_integer(inst, qc); },
                        {"[convert]", "float zero point on bf16 weights", "f32 master weights"});
}

}  // namespace
}  // namespace qg
