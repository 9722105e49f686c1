// The language-model QAT recipes (nn::parse_recipe) on a tiny Llama: each quantizer is one
// dynamic_fake_quantize node with the recipe's attributes (no observer, no composed STE);
// the weights' and activations' fake-quant values equal an independent f32 re-derivation of
// torchao's formulas (symmetric groups, the bf16 float zero point, per-token int8); every
// recipe trains; and the bad recipes, group sizes and bit widths are named errors. The
// conformance against torchao itself is python/tests/test_torch_torchao_conformance.py (GPU
// machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/half_bits.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

std::string tiny_config(int hidden, int intermediate) {
  return R"({"hidden_size": )" + std::to_string(hidden) + R"(, "intermediate_size": )" +
         std::to_string(intermediate) +
         R"(, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 50, "max_position_embeddings": 16, "tie_word_embeddings": false})";
}

nn::LlamaModel tiny(Graph& g, const nn::QConfig& qc, int hidden = 64, int intermediate = 128) {
  return nn::build_llama(g, nn::parse_llama_config(tiny_config(hidden, intermediate), "tiny"), 2, 7,
                         qc, 3);
}

struct Case {
  std::string recipe;
  int group;
};

const std::vector<Case> kCases = {{"8da4w", 32},           {"8da4w", 64},
                                  {"8da3w", 32},           {"8da2w", 64},
                                  {"w8a8_dynamic", 32},    {"int4_weight_only", 32},
                                  {"int4_weight_only", 64}};

// One dynamic_fake_quantize per weight (and per GEMM input value with dynamic activations), with
// the recipe's codes, groups and eps; nothing of the observer or composed paths is left.
TEST(LlamaRecipes, EachQuantizerIsOneDynamicFakeQuantizeNode) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.recipe + " group " + std::to_string(c.group));
    const nn::QConfig qc = nn::parse_recipe(c.recipe, c.group);
    Graph g;
    nn::LlamaModel m = tiny(g, qc);
    const int linears = 7 + 1;  // q, k, v, o, gate, up, down, lm_head
    ASSERT_EQ(static_cast<int>(m.weights.size()), linears);
    const bool dyn_act = c.recipe != "int4_weight_only";
    // Activations: the linears that read one value share its quantizer (q/k/v, gate/up;
    // nn/gemm_operand.cpp), so one each for q/k/v, o, gate/up, down and lm_head.
    const int input_quantizers = 5;
    EXPECT_EQ(testing::count_live_ops(g, "dynamic_fake_quantize"),
              linears + (dyn_act ? input_quantizers : 0));
    for (const char* op : {"moving_average_observer", "minmax_observer", "fake_quantize",
                           "dynamic_range_quantize", "dequantize", "stop_gradient"})
      EXPECT_EQ(testing::count_live_ops(g, op), 0) << op;
    for (const nn::WeightQuantizer& w : m.weights) {
      const Node& n = g.node(w.observer);
      EXPECT_EQ(n.op->name, "dynamic_fake_quantize");
      EXPECT_EQ(n.outputs[0], w.quantized);
      EXPECT_EQ(w.qparam_output, 2);
      const Attrs& a = n.attrs;
      if (c.recipe == "int4_weight_only") {
        EXPECT_EQ(a.get_string("mode"), "float_zero");
        EXPECT_EQ(a.get_int("quant_min"), 0);
        EXPECT_EQ(a.get_int("quant_max"), 15);
        EXPECT_EQ(a.get_real("eps"), 1e-6);
        EXPECT_EQ(a.get_string("qparam_dtype"), "bf16");
      } else {
        const int bits = c.recipe == "w8a8_dynamic" ? 8 : c.recipe[3] - '0';
        EXPECT_EQ(a.get_string("mode"), "symmetric");
        EXPECT_EQ(a.get_int("quant_min"), -(1 << (bits - 1)));
        EXPECT_EQ(a.get_int("quant_max"), (1 << (bits - 1)) - 1);
        EXPECT_EQ(a.get_real("eps"), std::numeric_limits<float>::min());  // f32 weights
      }
      EXPECT_EQ(a.get_int("group_size"), c.recipe == "w8a8_dynamic" ? 0 : c.group);
    }
    for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
      const Node& n = g.node(id);
      if (n.op->name != "dynamic_fake_quantize" || n.attrs.get_string("mode") != "asymmetric")
        continue;
      EXPECT_EQ(n.attrs.get_int("quant_min"), -128);
      EXPECT_EQ(n.attrs.get_int("quant_max"), 127);
      EXPECT_EQ(n.attrs.get_int("group_size"), 0);  // per token
      EXPECT_EQ(n.attrs.get_real("eps"), std::numeric_limits<float>::epsilon());
    }
  }
}

float bf16(float v) {
  return half_bits::bf16_to_f32(half_bits::f32_to_bf16(v));
}

// torchao's get_group_qparams_symmetric + fake quantize, in f32, written out.
std::vector<float> symmetric_reference(const std::vector<float>& w, int64_t len, int bits) {
  const float qmin = -static_cast<float>(1 << (bits - 1)), qmax = -qmin - 1;
  const float inv_range = 1.0f / ((qmax - qmin) / 2.0f);
  std::vector<float> y(w.size());
  for (size_t g0 = 0; g0 < w.size(); g0 += static_cast<size_t>(len)) {
    float mn = 0, mx = 0;
    for (int64_t i = 0; i < len; ++i) mn = std::min(mn, w[g0 + i]), mx = std::max(mx, w[g0 + i]);
    float scale = std::max(-mn, mx) * inv_range;
    scale = std::max(scale, std::numeric_limits<float>::min());
    // The zero point is a tensor of zeros added and subtracted (so -0 codes become +0).
    const float inv = 1.0f / scale, zp = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      const float q = std::min(qmax, std::max(qmin, std::nearbyint(w[g0 + i] * inv) + zp));
      y[g0 + i] = (q - zp) * scale;
    }
  }
  return y;
}

// torchao's tinygemm qparams (f32, then bf16) and fake quantize with the float zero point.
std::vector<float> float_zero_reference(const std::vector<float>& w, int64_t len) {
  std::vector<float> y(w.size());
  for (size_t g0 = 0; g0 < w.size(); g0 += static_cast<size_t>(len)) {
    float mn = w[g0], mx = w[g0];
    for (int64_t i = 0; i < len; ++i) mn = std::min(mn, w[g0 + i]), mx = std::max(mx, w[g0 + i]);
    float scale = (mx - mn) * (1.0f / 15.0f);
    scale = std::max(scale, 1e-6f);
    const float zero = bf16(mn + scale * 8.0f);
    scale = bf16(scale);
    const float low = bf16(zero - bf16(scale * 8.0f));
    for (int64_t i = 0; i < len; ++i) {
      const float q = std::min(15.0f, std::max(0.0f, std::nearbyint((w[g0 + i] - low) / scale)));
      y[g0 + i] = (q - 8.0f) * scale + zero;
    }
  }
  return y;
}

// torchao's per-token asymmetric int8 (choose_qparams_affine, then fake quantize), in f32.
std::vector<float> token_reference(const std::vector<float>& x, int64_t len) {
  std::vector<float> y(x.size());
  for (size_t t0 = 0; t0 < x.size(); t0 += static_cast<size_t>(len)) {
    float mn = 0, mx = 0;
    for (int64_t i = 0; i < len; ++i) mn = std::min(mn, x[t0 + i]), mx = std::max(mx, x[t0 + i]);
    float scale = (mx - mn) * (1.0f / 255.0f);
    scale = std::max(scale, std::numeric_limits<float>::epsilon());
    const float zp = std::min(127.0f, std::max(-128.0f, -128.0f - std::nearbyint(mn / scale)));
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < len; ++i) {
      const float q = std::min(127.0f, std::max(-128.0f, std::nearbyint(x[t0 + i] * inv) + zp));
      y[t0 + i] = (q - zp) * scale;
    }
  }
  return y;
}

std::vector<float> floats(const Tensor& t) {
  Tensor c = t.to(Device::cpu());
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": first at " << first << ", " << got[first] << " vs "
                        << want[first];
}

// Every weight's and the q_proj input's fake-quant values against the references above, bit
// for bit (f32 weights and activations, the default precision).
TEST(LlamaRecipes, FakeQuantValuesEqualTorchaosFormulasWrittenOut) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.recipe + " group " + std::to_string(c.group));
    const nn::QConfig qc = nn::parse_recipe(c.recipe, c.group);
    Graph g;
    nn::LlamaModel m = tiny(g, qc);
    std::vector<ValueId> fetch;
    for (const nn::WeightQuantizer& w : m.weights)
      fetch.insert(fetch.end(), {w.source, w.quantized});
    ValueId x_in = kNoValue, x_fq = kNoValue;
    for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
      const Node& n = g.node(id);
      if (n.op->name == "dynamic_fake_quantize" && n.name.find("q_proj.in") != std::string::npos) {
        x_in = n.inputs[0];
        x_fq = n.outputs[0];
      }
    }
    const bool dyn_act = c.recipe != "int4_weight_only";
    ASSERT_EQ(x_in != kNoValue, dyn_act);
    if (dyn_act) fetch.insert(fetch.end(), {x_in, x_fq});
    Executor ex(g);
    std::vector<Tensor> got = ex.run(testing::tiny_llama_feeds(), fetch);
    for (size_t k = 0; k < m.weights.size(); ++k) {
      const std::vector<float> w = floats(got[2 * k]);
      const int64_t in = got[2 * k].shape()[1];
      std::vector<float> want;
      if (c.recipe == "int4_weight_only")
        want = float_zero_reference(w, c.group);
      else if (c.recipe == "w8a8_dynamic")
        want = symmetric_reference(w, in, 8);
      else
        want = symmetric_reference(w, c.group, c.recipe[3] - '0');
      expect_bits_equal(floats(got[2 * k + 1]), want, m.weights[k].layer);
    }
    if (dyn_act) {
      const Tensor& x = got[2 * m.weights.size()];
      expect_bits_equal(floats(got[2 * m.weights.size() + 1]),
                        token_reference(floats(x), x.shape().back()), "q_proj input");
    }
  }
}

// A layer narrower than one group (hidden 64, groups of 256) is one group per row, as
// torchao's qparam functions clamp the group size.
TEST(LlamaRecipes, ALayerNarrowerThanAGroupIsOneGroupPerRow) {
  Graph g;
  nn::LlamaModel m = tiny(g, nn::parse_recipe("8da4w", 256));
  const nn::WeightQuantizer& q = m.weights.at(0);  // q_proj [64, 64]
  EXPECT_EQ(g.node(q.observer).attrs.get_int("group_size"), 64);
  const nn::WeightQuantizer& down = m.weights.at(6);  // down_proj [64, 128]: one group of 128
  EXPECT_EQ(g.node(down.observer).attrs.get_int("group_size"), 128);
  Executor ex(g);
  std::vector<Tensor> got = ex.run(testing::tiny_llama_feeds(), {q.source, q.quantized});
  expect_bits_equal(floats(got[1]), symmetric_reference(floats(got[0]), 64, 4), q.layer);
}

// Group sizes 128 and 256 on a model wide enough for them.
TEST(LlamaRecipes, LargeGroupsOnAWideModel) {
  for (int group : {128, 256})
    for (const std::string recipe : {"8da4w", "int4_weight_only"}) {
      SCOPED_TRACE(recipe + " group " + std::to_string(group));
      Graph g;
      nn::LlamaModel m = tiny(g, nn::parse_recipe(recipe, group), 256, 512);
      Executor ex(g);
      const nn::WeightQuantizer& w = m.weights.at(0);
      std::vector<Tensor> got =
          ex.run(testing::tiny_llama_feeds(), {w.source, w.quantized, m.loss});
      EXPECT_TRUE(std::isfinite(got[2].to_doubles()[0]));
      const std::vector<float> src = floats(got[0]);
      expect_bits_equal(
          floats(got[1]),
          recipe == "8da4w" ? symmetric_reference(src, group, 4) : float_zero_reference(src, group),
          w.layer);
    }
}

// Adam steps on one fixed batch through compile(): each recipe's loss falls well below its
// start (the STE carries the gradient through every quantizer).
TEST(LlamaRecipes, EveryRecipeTrains) {
  for (const std::string recipe : {"8da4w", "8da3w", "8da2w", "w8a8_dynamic", "int4_weight_only"}) {
    SCOPED_TRACE(recipe);
    Graph g;
    nn::LlamaModel m = tiny(g, nn::parse_recipe(recipe, 32));
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
    double first = 0, last = 0;
    for (int s = 0; s < 25; ++s) {
      last = step.train(testing::tiny_llama_feeds(), {m.loss})[0].to_doubles()[0];
      ASSERT_TRUE(std::isfinite(last)) << "step " << s;
      if (s == 0) first = last;
    }
    EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  }
}

TEST(LlamaRecipes, RecipeNamesAndStrings) {
  EXPECT_EQ(nn::recipe_names(), (std::vector<std::string>{"float", "8da4w", "8da3w", "8da2w",
                                                          "int4_weight_only", "w8a8_dynamic"}));
  EXPECT_EQ(nn::parse_recipe("8da4w", 64).str(), "W4A8dyn (weights per group of 64, dynamic)");
  EXPECT_EQ(nn::parse_recipe("8da3w", 32).str(), "W3A8dyn (weights per group of 32, dynamic)");
  EXPECT_EQ(nn::parse_recipe("int4_weight_only", 128).str(),
            "W4A32 (weights per group of 128, dynamic, float zero)");
  EXPECT_EQ(nn::parse_recipe("w8a8_dynamic", 32).str(), "W8A8dyn (weights per channel, dynamic)");
  EXPECT_FALSE(nn::parse_recipe("float", 32).quantized());
  // The static recipes keep their description.
  EXPECT_EQ(nn::QConfig::w8a8().str(), "W8A8 (weights per channel, moving_average observers)");
}

TEST(LlamaRecipes, BadRecipesGroupSizesAndBitWidthsAreNamedErrors) {
  expect_error([] { nn::parse_recipe("8da5w", 32); },
               {"[qconfig]", "recipe '8da5w'", "not one of", "8da4w", "int4_weight_only"});
  for (int group : {0, 16, 48, 512})
    expect_error([&] { nn::parse_recipe("8da4w", group); },
                 {"[qconfig]", "recipe '8da4w'", "group size " + std::to_string(group),
                  "not one of 32, 64, 128, 256"});
  expect_error([] { nn::parse_recipe("int4_weight_only", 100); },
               {"[qconfig]", "int4_weight_only", "group size 100"});
  for (int bits : {1, 5, 8})
    expect_error([&] { nn::QConfig::int8_dyn_act_intx_weight(bits, 32); },
                 {"[qconfig]", "weight bits " + std::to_string(bits), "2, 3 or 4"});
  // A group size that does not divide a layer's inputs: named by the layer (hidden 96).
  Graph g;
  expect_error([&] { tiny(g, nn::parse_recipe("8da4w", 64), 96, 192); },
               {"[nn]", "layer 'model.layers.0.self_attn.q_proj'", "group size 64",
                "does not divide its 96 inputs"});
  Graph g2;
  expect_error([&] { tiny(g2, nn::parse_recipe("int4_weight_only", 128), 192, 384); },
               {"[nn]", "group size 128", "does not divide its 192 inputs"});
  // Bit widths and mappings outside what a recipe implements.
  nn::QConfig float_zero8 = nn::QConfig::int4_weight_only(32);
  float_zero8.weight = nn::WeightQuant::int8;
  expect_error([&] { float_zero8.validate(); },
               {"[qconfig]", "float zero point", "int4", "got int8 weights per group"});
  nn::QConfig observed_int3 = nn::QConfig::int8_dyn_act_intx_weight(3, 32);
  observed_int3.dynamic_weights = false;
  Graph g3;
  expect_error([&] { tiny(g3, observed_int3); }, {"[qconfig]", "int3", "dynamic recipe"});
  nn::QConfig dynamic_nf4 = nn::QConfig::int8_dyn_act_int4_weight(32);
  dynamic_nf4.weight = nn::WeightQuant::nf4;
  expect_error([&] { dynamic_nf4.validate(); }, {"[qconfig]", "dynamic weights", "nf4"});
  nn::QConfig per_tensor = nn::QConfig::int8_dyn_act_int8_weight();
  per_tensor.weight_scope = "tensor";
  expect_error([&] { per_tensor.validate(); }, {"[qconfig]", "not per tensor"});
  expect_error([] { nn::parse_weight_quant("5"); }, {"[qconfig]", "'5'", "32, 8, 4, 3, 2, nf4"});
}

}  // namespace
}  // namespace qg
