// Conversion of a trained Llama decoder to integer weights (nn::convert_to_integer): the
// converted model's logits equal the QAT model's eval-mode logits bit for bit on the CPU, for
// every recipe with integer weight codes and in f32 and bf16-mixed; no weight fake-quant and no
// float projection weight is left; weights with a float zero point are a named error. On a
// GPU, the converted model's CUDA logits equal the QAT model's CUDA logits bit for bit too
// (the dequantize ops compute code * scale in f32 as the fake-quant does; the GEMMs then read
// the same values).
#include <gtest/gtest.h>

#include <cstring>

#include "nn/convert.h"
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
  return nn::parse_llama_config(
      R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
          "max_position_embeddings": 16, "tie_word_embeddings": false})",
      "tiny");
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
                                   {"w8a8_dynamic", 32, "dequantize"}};
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
  for (const std::string recipe : {"8da4w", "w8a8_dynamic"})
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

TEST(LlamaConvert, FloatZeroPointWeightsAreANamedError) {
  const nn::QConfig qc = nn::parse_recipe("int4_weight_only", 32);
  nn::LlamaInstance inst = trained_instance(qc, nn::PrecisionPolicy::f32());
  testing::expect_error([&] { nn::convert_to_integer(inst, qc); },
                        {"[convert]", "float zero point", "int4 weight-only"});
}

}  // namespace
}  // namespace qg
