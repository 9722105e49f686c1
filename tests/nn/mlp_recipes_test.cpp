// Every QConfig recipe on the MLP: it trains (loss falls), and the model converted to
// integer weights by the graph pass (nn/convert.h) gives exactly the fake-quant graph's
// accuracy, with the storage format's size ordering. These run without the CNN and
// transformer ops.
#include <gtest/gtest.h>

#include "nn/quantized.h"
#include "tests/nn/nn_util.h"
#include "train/evaluate.h"

namespace qg {
namespace {

using testing::digits;
using testing::small_config;

struct NamedRecipe {
  const char* name;
  nn::QConfig qc;
};

std::vector<NamedRecipe> recipes() {
  nn::QConfig w4a8_tensor = nn::QConfig::w4a8();
  w4a8_tensor.weight_scope = "tensor";
  return {{"w8a8", nn::QConfig::w8a8()},
          {"w4a8", nn::QConfig::w4a8()},
          {"w4a8 per tensor", w4a8_tensor},
          {"w4a8 group 8", nn::QConfig::w4a8_group(8)},
          {"w4a4", nn::QConfig::w4a4()},
          {"w2a8", nn::QConfig::w2a8()},
          {"nf4a8", nn::QConfig::nf4a8()},
          {"8da4w group 16", nn::QConfig::int8_dyn_act_int4_weight(16)},
          {"8da3w group 16", nn::QConfig::int8_dyn_act_intx_weight(3, 16)},
          {"8da2w group 8", nn::QConfig::int8_dyn_act_intx_weight(2, 8)},
          {"w8a8 dynamic", nn::QConfig::int8_dyn_act_int8_weight()}};
}

TEST(MlpRecipes, TrainAndConvertToTheFakeQuantAccuracy) {
  const auto& d = digits();
  int64_t float_bytes = 0;
  {
    nn::Trainer t(small_config("mlp", nn::QConfig::float32()), d.train, d.test);
    t.integer_accuracy(d.test, &float_bytes);
  }
  for (const auto& r : recipes()) {
    SCOPED_TRACE(r.name);
    nn::Trainer t(small_config("mlp", r.qc), d.train, d.test);
    t.train_epoch();
    t.train_epoch();
    const auto& h = t.history();
    EXPECT_LT(h[1].train_loss, h[0].train_loss);
    const double fq = t.evaluate(d.test);
    EXPECT_GT(fq, 0.5);
    int64_t bytes = 0;
    // Same codes and qparams as the fake-quant graph: the logits match exactly.
    EXPECT_EQ(t.integer_accuracy(d.test, &bytes), fq);
    EXPECT_LT(bytes, float_bytes);
    if (r.qc.weight_bits() <= 4) {
      EXPECT_LT(bytes, float_bytes / 3) << bytes << " vs " << float_bytes;
    }
  }
}

TEST(MlpRecipes, GeneralConversionMatchesQuantizedMlp) {
  const auto& d = digits();
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::w4a8(), nn::QConfig::nf4a8()}) {
    nn::Trainer t(small_config("mlp", qc), d.train, d.test);
    t.train_epoch();
    nn::QuantizedMlp q =
        nn::convert_to_quantized(t.executor(), t.model().layers, t.model().input_observer, qc);
    int64_t bytes = 0;
    EXPECT_EQ(t.integer_accuracy(d.test, &bytes), nn::accuracy_of(q, d.test)) << qc.str();
    // The graph also stores each weight quantizer's (all-zero) i32 zero points.
    EXPECT_GE(bytes, q.size_bytes());
  }
}

TEST(MlpRecipes, ConvertedGraphHoldsIntegerCodesNotFloatWeights) {
  const auto& d = digits();
  nn::Trainer t(small_config("mlp", nn::QConfig::w4a8_group(8)), d.train, d.test);
  t.train_epoch();
  nn::ModelInstance inst =
      nn::build_instance(t.config().spec(), 16, t.config().qconfig, Device::cpu());
  nn::copy_states(t.executor(), *inst.exec);
  nn::convert_to_integer(inst, t.config().qconfig);
  std::vector<bool> needed = inst.graph->needed_nodes({inst.model.logits});
  int unpack = 0;
  for (NodeId id = 0; id < inst.graph->num_nodes(); ++id) {
    if (!needed[id]) continue;
    const Node& n = inst.graph->node(id);
    // Activation fake-quants stay (frozen); no weight fake-quant remains.
    if (n.op->name == "fake_quantize") {
      EXPECT_EQ(n.name.find(".weight"), std::string::npos) << n.name;
    }
    if (n.op->name == "int4_unpack_dequantize") ++unpack;
    if (n.op->name == "parameter") {
      EXPECT_EQ(n.name.find(".weight"), std::string::npos) << n.name;
    }
  }
  EXPECT_EQ(unpack, 2);
}

TEST(MlpRecipes, QuantizedMlpRejectsRecipesItCannotStore) {
  const auto& d = digits();
  nn::Trainer t(small_config("mlp", nn::QConfig::w4a4()), d.train, d.test);
  testing::expect_error(
      [&] {
        nn::convert_to_quantized(t.executor(), t.model().layers, t.model().input_observer,
                                 t.config().qconfig);
      },
      {"quantize", "QuantizedMlp", "W4A4"});
}

// The float zero point (int4 weight-only) trains, and converts (unsigned INT4 codes with each
// group's float zero added after the dequantize, nn/convert_float_zero.h) to a model of the
// same accuracy: its weights are the fake-quantized ones bit for bit. Per group of 8 weights it
// stores 4 bytes of nibbles, an f32 scale, an f32 zero and the u8 zero point 8 of the
// dequantize: 13 bytes against 32, so below half the float model's bytes.
TEST(MlpRecipes, Int4WeightOnlyTrainsAndConvertsToTheSameAccuracy) {
  const auto& d = digits();
  nn::Trainer t(small_config("mlp", nn::QConfig::int4_weight_only(8)), d.train, d.test);
  t.train_epoch();
  t.train_epoch();
  EXPECT_LT(t.history()[1].train_loss, t.history()[0].train_loss);
  const double fq = t.evaluate(d.test);
  EXPECT_GT(fq, 0.5);
  int64_t bytes = 0, float_bytes = 0;
  EXPECT_EQ(t.integer_accuracy(d.test, &bytes), fq);
  nn::Trainer f(small_config("mlp", nn::QConfig::float32()), d.train, d.test);
  f.integer_accuracy(d.test, &float_bytes);
  EXPECT_LT(bytes, float_bytes / 2) << bytes << " vs " << float_bytes;
}

}  // namespace
}  // namespace qg
