// Conversion of a trained Llama decoder to integer weights (nn::convert_to_integer): the
// converted model's logits equal the QAT model's eval-mode logits bit for bit on the CPU, for
// every recipe with integer weight codes and in f32 and bf16-mixed; no weight fake-quant and no
// float projection weight is left; int4 weight-only's float zero point converts for f32 master
// weights and is a named error on bf16 ones. On a GPU, the converted model's CUDA logits equal
// the QAT model's CUDA logits bit for bit too (the dequantize ops compute code * scale in f32
// as the fake-quant does; the GEMMs then read the same values).
#include <gtest/gtest.h>

#include <cstring>

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
