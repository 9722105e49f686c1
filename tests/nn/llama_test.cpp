// The Llama decoder: config.json parsing and its errors; a tiny model's logits and loss
// against a plain-torch reference of LlamaForCausalLM (tests/nn/llama_reference.py, Debian's
// torch 1.13) on the same weights, tied and untied; training steps lowering the loss; and
// the causal mask (no position sees a later token).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/npy.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

const char* kTinyConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "vocab_size": 50, "max_position_embeddings": 64,
  "tie_word_embeddings": false, "rope_scaling": null, "attention_bias": false
})";

std::string with_tied(bool tied) {
  std::string s = kTinyConfig;
  const std::string from = "\"tie_word_embeddings\": false";
  if (tied) s.replace(s.find(from), from.size(), "\"tie_word_embeddings\": true");
  return s;
}

TEST(LlamaConfig, ParsesEveryField) {
  nn::LlamaConfig c = nn::parse_llama_config(kTinyConfig, "tiny");
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.vocab_size, 50);
  EXPECT_EQ(c.max_position_embeddings, 64);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_TRUE(nn::parse_llama_config(with_tied(true), "tied").tie_word_embeddings);
}

// The optional fields take transformers' LlamaConfig defaults.
TEST(LlamaConfig, OptionalFieldsTakeLlamaConfigDefaults) {
  nn::LlamaConfig c = nn::parse_llama_config(
      R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
          "num_attention_heads": 8, "vocab_size": 10})",
      "minimal");
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(LlamaConfig, BadOrMissingFieldsAreNamed) {
  auto without = [](const std::string& field) {
    std::string s = kTinyConfig;
    size_t at = s.find("\"" + field + "\"");
    size_t end = s.find(',', at);
    return s.erase(at, end + 1 - at);
  };
  auto replaced = [](const std::string& from, const std::string& to) {
    std::string s = kTinyConfig;
    return s.replace(s.find(from), from.size(), to);
  };
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    SCOPED_TRACE(field);
    expect_error([&] { nn::parse_llama_config(without(field), "cfg.json"); },
                 {"cfg.json", "required field '" + std::string(field) + "' is missing"});
  }
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"hidden_size\": 32", "\"hidden_size\": \"32\""), "c");
      },
      {"field 'hidden_size' must be an integer, got \"32\""});
  expect_error(
      [&] { nn::parse_llama_config(replaced("\"vocab_size\": 50", "\"vocab_size\": 50.0"), "c"); },
      {"field 'vocab_size' must be an integer"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 0"),
                               "c");
      },
      {"field 'num_hidden_layers' must be positive, got 0"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
                               "c");
      },
      {"field 'num_key_value_heads' (3) must divide num_attention_heads (4)"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"num_attention_heads\": 4", "\"num_attention_heads\": 5"),
                               "c");
      },
      {"field 'num_attention_heads' (5) must divide hidden_size (32)"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1"), "c");
      },
      {"field 'rms_norm_eps' must be positive"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"rope_theta\": 10000.0", "\"rope_theta\": \"big\""), "c");
      },
      {"field 'rope_theta' must be a number"});
  expect_error(
      [&] {
        nn::parse_llama_config(with_tied(false).replace(with_tied(false).find("false"), 5, "0"),
                               "c");
      },
      {"field 'tie_word_embeddings' must be true or false, got 0"});
  expect_error(
      [&] {
        nn::parse_llama_config(
            replaced("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"llama3\"}"),
            "c");
      },
      {"field 'rope_scaling'", "is not supported"});
  expect_error(
      [&] {
        nn::parse_llama_config(replaced("\"attention_bias\": false", "\"attention_bias\": true"),
                               "c");
      },
      {"field 'attention_bias' = true is not supported"});
  expect_error([&] { nn::parse_llama_config(replaced("\"silu\"", "\"gelu\""), "c"); },
               {"field 'hidden_act' = \"gelu\" is not supported"});
  expect_error([] { nn::parse_llama_config("{\"hidden_size\": ", "broken.json"); },
               {"broken.json: not a JSON object"});
  expect_error([] { nn::load_llama_config("/nonexistent/config.json"); },
               {"/nonexistent/config.json"});
}

// A tiny model with every parameter drawn at random (the norms' ones too, so a swapped
// weight shows), input ids of batch 2 x seq 7.
struct Tiny {
  Graph g;
  nn::LlamaModel m;
  std::unique_ptr<Executor> ex;
  Tensor ids;
  Tiny(const std::string& config_json, const nn::QConfig& qc = nn::QConfig::float32()) {
    m = nn::build_llama(g, nn::parse_llama_config(config_json, "tiny"), 2, 7, qc, 5);
    ex = std::make_unique<Executor>(g);
    uint32_t seed = 11;
    for (ValueId p : m.parameters) {
      Tensor& t = ex->parameter(g.value(p).name);
      Tensor r = testing::random_f32(t.shape(), seed++);
      // Weights near transformers' N(0, 0.02) scale would leave the logits tiny; 0.3 keeps
      // every layer's contribution visible.
      std::vector<double> v = r.to_doubles();
      for (double& x : v) x *= 0.3;
      t = Tensor::from_doubles(t.shape(), v, DType::f32);
    }
    ids = Tensor::from_vector<int64_t>({2, 7}, {3, 17, 42, 0, 49, 8, 8, 25, 1, 33, 12, 40, 7, 19});
  }
  Executor::Feeds feeds(const Tensor& input_ids) const {
    return {{"input_ids", input_ids}, {"labels", nn::next_token_labels(input_ids)}};
  }
};

TEST(Llama, ParameterNamesAreTransformers) {
  Tiny t(kTinyConfig);
  std::vector<std::string> names;
  for (ValueId p : t.m.parameters) names.push_back(t.g.value(p).name);
  ASSERT_EQ(names.size(), 1u + 2u * 9u + 2u);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(names[2], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[3], "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(names[6], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(names[7], "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(names[9], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(t.g.value(t.m.parameters[3]).type.shape, (Shape{16, 32}));  // 2 KV heads x 8
  EXPECT_EQ(t.g.value(t.m.logits).type, (TensorType{DType::f32, {2, 7, 50}}));
  EXPECT_EQ(t.m.layers.size(), 2u * 7u + 1u);  // 4 attention + 3 MLP projections, lm_head
  Tiny tied(with_tied(true));
  EXPECT_EQ(tied.m.parameters.size(), names.size() - 1);
  EXPECT_EQ(tied.g.value(tied.m.parameters.back()).name, "model.norm.weight");
}

TEST(Llama, BadShapesAreNamed) {
  Graph g;
  nn::LlamaConfig c = nn::parse_llama_config(kTinyConfig, "tiny");
  expect_error([&] { nn::build_llama(g, c, 2, 1, nn::QConfig::float32(), 1); },
               {"nn.llama", "seq 1 within [2, max_position_embeddings = 64]"});
  expect_error([&] { nn::build_llama(g, c, 2, 65, nn::QConfig::float32(), 1); }, {"seq 65"});
  expect_error(
      [] {
        nn::next_token_labels(Tensor::from_vector<int64_t>({2}, {1, 2}));
      },
      {"next_token_labels needs i64 [batch, seq >= 2]"});
  EXPECT_EQ(
      nn::next_token_labels(Tensor::from_vector<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6})).to_doubles(),
      (std::vector<double>{2, 3, 5, 6}));
}

const char* kPython = "/usr/bin/python3";

bool torch_available() {
  const std::string cmd = std::string(kPython) + " -c 'import numpy, torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Logits and loss against tests/nn/llama_reference.py on the same weights and ids.
// Tolerance: f32 throughout; both sides sum the GEMMs in their own order (Eigen vs torch's
// BLAS) through 2 blocks, which leaves about one f32 ulp at the logits' scale (1.2e-7
// measured). 2e-6 of max(1, max |logit|) allows ~16 ulps for other SIMD widths, far below
// what a wrong step moves (KV heads tiled instead of interleaved: 0.6; no mask: 0.48).
void expect_matches_torch(bool tied) {
  if (!torch_available()) GTEST_SKIP() << kPython << " with numpy and torch is not installed";
  Tiny t(with_tied(tied));
  const std::string dir = ::testing::TempDir() + "llama_ref_" + (tied ? "tied" : "untied");
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  { std::ofstream(dir + "/config.json") << with_tied(tied); }
  save_npy(dir + "/input_ids.npy", t.ids);
  for (ValueId p : t.m.parameters) {
    const std::string& name = t.g.value(p).name;
    save_npy(dir + "/" + name + ".npy", t.ex->parameter(name));
  }
  const std::string cmd =
      std::string(kPython) + " " + QG_NN_TEST_DIR + "/llama_reference.py '" + dir + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto out = t.ex->run(t.feeds(t.ids), {t.m.logits, t.m.loss});
  Tensor ref = load_npy(dir + "/ref_logits.npy");
  ASSERT_EQ(ref.shape(), out[0].shape());
  std::vector<double> got = out[0].to_doubles(), want = ref.to_doubles();
  double max_ref = 0.0, err = 0.0;
  for (double w : want) max_ref = std::max(max_ref, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  EXPECT_GT(max_ref, 0.5);  // the weights' scale leaves visible logits
  EXPECT_LE(err, 2e-6 * std::max(1.0, max_ref)) << "max |logit| " << max_ref;
  std::printf("max |logit| %.3g, max error %.3g\n", max_ref, err);
  const double ref_loss = load_npy(dir + "/ref_loss.npy").to_doubles()[0];
  EXPECT_NEAR(out[1].to_doubles()[0], ref_loss, 2e-6 * std::max(1.0, ref_loss));
}

TEST(Llama, LogitsMatchTorchReferenceUntied) {
  expect_matches_torch(false);
}
TEST(Llama, LogitsMatchTorchReferenceTied) {
  expect_matches_torch(true);
}

// Changing token j changes no logit of positions before j, and does change position j's.
TEST(Llama, CausalMaskHidesLaterTokens) {
  Tiny t(kTinyConfig);
  std::vector<double> base = t.ex->run(t.feeds(t.ids), {t.m.logits})[0].to_doubles();
  const int64_t seq = 7, vocab = 50;
  for (int64_t j : {int64_t{6}, int64_t{3}}) {
    SCOPED_TRACE(j);
    Tensor changed = t.ids.clone();
    changed.data<int64_t>()[j] = (changed.data<int64_t>()[j] + 5) % vocab;  // sequence 0 only
    std::vector<double> got = t.ex->run(t.feeds(changed), {t.m.logits})[0].to_doubles();
    for (int64_t pos = 0; pos < seq; ++pos) {
      bool same = true;
      for (int64_t v = 0; v < vocab; ++v)
        same = same && got[pos * vocab + v] == base[pos * vocab + v];
      EXPECT_EQ(same, pos < j) << "position " << pos;
    }
    // The other sequence of the batch is untouched everywhere.
    for (int64_t i = seq * vocab; i < 2 * seq * vocab; ++i) ASSERT_EQ(got[i], base[i]);
  }
}

// Adam steps on one fixed batch through compile(): the loss falls well below its start.
TEST(Llama, TrainingStepsLowerTheLoss) {
  for (const nn::QConfig& qc : {nn::QConfig::float32(), nn::QConfig::w8a8()}) {
    SCOPED_TRACE(qc.str());
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, nn::parse_llama_config(kTinyConfig, "tiny"), 2, 7, qc, 3);
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
    Tensor ids =
        Tensor::from_vector<int64_t>({2, 7}, {3, 17, 42, 0, 49, 8, 8, 25, 1, 33, 12, 40, 7, 19});
    Executor::Feeds feeds{{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}};
    double first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
      double loss = step.train(feeds, {m.loss})[0].to_doubles()[0];
      ASSERT_TRUE(std::isfinite(loss)) << "step " << s;
      if (s == 0) first = loss;
      last = loss;
    }
    EXPECT_GT(first, 3.0);  // about log(50) = 3.9 at init
    EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  }
}

// bf16-mixed (torch.autocast's layout): f32 parameters and residual stream, bf16 GEMMs,
// attention and logits, an f32 loss. The first loss equals the f32 model's within bf16's
// rounding of the logits (a relative 2^-8 of each logit, with logits of a few units: the
// loss moves by well under 0.05), and 30 Adam steps train it as far as the f32 model.
TEST(Llama, Bf16MixedPrecisionTrainsAsF32) {
  const nn::LlamaConfig config = nn::parse_llama_config(kTinyConfig, "tiny");
  Tensor ids =
      Tensor::from_vector<int64_t>({2, 7}, {3, 17, 42, 0, 49, 8, 8, 25, 1, 33, 12, 40, 7, 19});
  Executor::Feeds feeds{{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}};
  std::vector<std::vector<double>> losses;
  for (const nn::PrecisionPolicy& precision :
       {nn::PrecisionPolicy::f32(), nn::PrecisionPolicy::bf16_mixed()}) {
    SCOPED_TRACE(precision.name());
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, config, 2, 7, nn::QConfig::float32(), 3, precision);
    EXPECT_EQ(g.value(m.loss).type.dtype, DType::f32);
    EXPECT_EQ(g.value(m.logits).type.dtype, precision.compute);
    for (ValueId p : m.parameters) EXPECT_EQ(g.value(p).type.dtype, DType::f32);
    int casts = 0;
    for (NodeId n = 0; n < static_cast<NodeId>(g.num_nodes()); ++n)
      casts += g.node(n).op->name == "cast";
    // Per layer: 7 weights and 5 GEMM inputs (q, k and v share theirs) to bf16, 2 outputs
    // back; the lm_head's weight and input.
    EXPECT_EQ(casts, precision.mixed() ? 2 * (7 + 5 + 2) + 2 : 0);
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
    std::vector<double> run;
    for (int s = 0; s < 30; ++s) {
      run.push_back(step.train(feeds, {m.loss})[0].to_doubles()[0]);
      ASSERT_TRUE(std::isfinite(run.back())) << "step " << s;
    }
    losses.push_back(run);
  }
  EXPECT_NEAR(losses[1][0], losses[0][0], 0.05);
  EXPECT_NE(losses[1][0], losses[0][0]);  // the bf16 GEMMs did run
  EXPECT_LT(losses[1].back(), 0.5 * losses[1][0]);
  EXPECT_LT(losses[1].back(), losses[0].back() + 0.1);
}

}  // namespace
}  // namespace qg
