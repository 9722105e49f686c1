// nn/hf_llama_import and nn/hf_checkpoint on checkpoint folders written here: the round
// trip through one file and through shards, bf16 and f16 files into f32 parameters, the
// tied lm_head and inv_freq rules, transformers 5's rope_parameters in config.json, and one
// named qg::Error per bad input (missing and extra names, a shape, a config that differs
// from the model's or from its own weights, a corrupt or inconsistent index, a missing
// shard, a truncated file), each leaving every parameter unchanged.
#include <gtest/gtest.h>

#include "tests/core/test_util.h"
#include "tests/import/hf_llama_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::LlamaUnderTest;

nn::LlamaConfig small_config(bool tied = false) {
  nn::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500.0;
  c.tie_word_embeddings = tied;
  return c;
}

// A source model (seed 7) whose weights are written to a folder, and a target model (seed 1)
// to import into; `before` is the target's parameters before any import.
struct HfImport : ::testing::Test {
  nn::LlamaConfig config = small_config();
  std::unique_ptr<LlamaUnderTest> source, target;
  std::map<std::string, Tensor> weights, before;
  std::string dir;
  void SetUp() override { make(small_config()); }
  void make(const nn::LlamaConfig& c) {
    config = c;
    source = std::make_unique<LlamaUnderTest>(c, 1, 4, 7);
    target = std::make_unique<LlamaUnderTest>(c, 1, 4, 1);
    weights = source->params();
    before = target->params();
    dir = testing::fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void write(const std::map<std::string, Tensor>& tensors, int shards = 0) {
    testing::write_checkpoint(dir, testing::config_json(config), tensors, shards);
  }
  nn::ImportReport import() { return nn::import_hf_llama(*target->ex, config, dir); }
  void expect_unchanged() {
    for (const auto& [name, t] : target->params())
      EXPECT_TRUE(testing::same_bits(t, before.at(name))) << name << " changed";
  }
  void expect_imported(const std::map<std::string, Tensor>& want) {
    for (const auto& [name, t] : target->params())
      EXPECT_TRUE(testing::same_bits(t, want.at(name))) << name;
  }
  void expect_import_error(const std::vector<std::string>& fragments) {
    expect_error([&] { import(); }, fragments);
    expect_unchanged();
  }
};

TEST_F(HfImport, OneFileRoundTrip) {
  write(weights);
  nn::ImportReport r = import();
  EXPECT_EQ(r.loaded.size(), weights.size());
  EXPECT_TRUE(r.ignored.empty());
  expect_imported(weights);
}

TEST_F(HfImport, ShardedRoundTripGivesTheSameParameters) {
  write(weights, 3);
  EXPECT_EQ(import().loaded.size(), weights.size());
  expect_imported(weights);
}

// bf16 and f16 widen to f32 exactly: the parameters are the file's values, bit for bit.
TEST_F(HfImport, HalfPrecisionFilesWidenExactly) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::map<std::string, Tensor> narrow, widened;
    for (const auto& [name, t] : weights) {
      narrow[name] = t.cast(dt);
      widened[name] = narrow[name].cast(DType::f32);
    }
    write(narrow);
    import();
    expect_imported(widened);
    bool rounded = false;  // the file really was narrower than the source
    for (const auto& [name, t] : weights) rounded |= !testing::same_bits(t, widened.at(name));
    EXPECT_TRUE(rounded);
  }
}

// f32 values into a bf16 parameter (nn/import_weights, which the Llama import uses) round
// to nearest even; a value beyond bf16's range is refused rather than stored as inf.
TEST(HfImportDtypes, F32IntoBf16ParameterRoundsToNearestEven) {
  Graph g;
  g.parameter("w", Tensor::zeros({3}, DType::bf16));
  Executor ex(g);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even 1;
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6.
  const std::vector<double> in{1.0 + 1.0 / 256, 1.0 + 3.0 / 256, -2.5};
  nn::import_weights(ex, {{"w", Tensor::from_doubles({3}, in, DType::f32)}});
  EXPECT_EQ(ex.parameter("w").to_doubles(), (std::vector<double>{1.0, 1.0 + 4.0 / 256, -2.5}));
  expect_error(
      [&] {
        nn::import_weights(ex, {{"w", Tensor::from_doubles({3}, {1, 1e39, 1}, DType::f64)}});
      },
      {"'w'", "not finite in bf16"});
}

TEST_F(HfImport, RotaryInvFreqBuffersAreIgnoredWithAReason) {
  std::map<std::string, Tensor> w = weights;
  w["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor::zeros({2}, DType::f32);
  w["model.rotary_emb.inv_freq"] = Tensor::zeros({2}, DType::f32);
  write(w);
  nn::ImportReport r = import();
  EXPECT_EQ(r.ignored.size(), 2u);
  EXPECT_NE(r.summary().find("derives them from rope_theta"), std::string::npos) << r.summary();
  expect_imported(weights);
}

TEST_F(HfImport, TiedCheckpointWithoutLmHead) {
  make(small_config(/*tied=*/true));
  ASSERT_FALSE(weights.count("lm_head.weight"));
  write(weights);
  EXPECT_EQ(import().loaded.size(), weights.size());
  expect_imported(weights);
}

// A tied checkpoint that also stores lm_head.weight: the same values are a second copy of
// the shared table (ignored, with the reason); other values would be dropped, so they are
// an error.
TEST_F(HfImport, TiedCheckpointWithLmHeadCopyOrConflict) {
  make(small_config(/*tied=*/true));
  std::map<std::string, Tensor> w = weights;
  w["lm_head.weight"] = weights.at("model.embed_tokens.weight").clone();
  write(w);
  nn::ImportReport r = import();
  ASSERT_EQ(r.ignored.size(), 1u);
  EXPECT_EQ(r.ignored[0].first, "lm_head.weight");
  EXPECT_NE(r.ignored[0].second.find("tie_word_embeddings"), std::string::npos);
  expect_imported(weights);

  make(small_config(/*tied=*/true));
  w = weights;
  std::vector<double> v = weights.at("model.embed_tokens.weight").to_doubles();
  v[5] += 0.25;
  w["lm_head.weight"] = Tensor::from_doubles({40, 16}, v, DType::f32);
  write(w);
  expect_import_error({"[nn.import]", "ties the embeddings", "lm_head.weight (model.safetensors)",
                       "differs from model.embed_tokens.weight", "by up to 0.25",
                       "nothing was changed"});
}

TEST_F(HfImport, MissingNamesAreAllListed) {
  std::map<std::string, Tensor> w = weights;
  w.erase("model.layers.1.mlp.up_proj.weight");
  w.erase("lm_head.weight");
  write(w);
  expect_import_error(
      {"[nn.import]", "nothing was changed", "2 model parameter(s) missing from the file",
       "model.layers.1.mlp.up_proj.weight f32[24, 16]", "lm_head.weight f32[40, 16]"});
}

TEST_F(HfImport, ExtraNamesAreAllListed) {
  std::map<std::string, Tensor> w = weights;
  w["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros({16}, DType::f32);
  w["score.weight"] = Tensor::zeros({2, 16}, DType::f32);
  write(w);
  expect_import_error({"2 file tensor(s) match no model parameter",
                       "'model.layers.0.self_attn.q_proj.bias'", "'score.weight'"});
}

TEST_F(HfImport, ShapeMismatchNamesBothShapes) {
  std::map<std::string, Tensor> w = weights;
  w["model.layers.1.self_attn.o_proj.weight"] = Tensor::zeros({16, 15}, DType::f32);
  write(w);
  expect_import_error({"1 shape/dtype mismatch(es)",
                       "'model.layers.1.self_attn.o_proj.weight': the file holds f32[16, 15], "
                       "the model needs f32[16, 16]"});
}

// The model's config and the folder's config.json differ: each field is named.
TEST_F(HfImport, ModelConfigDifferingFromConfigJsonIsNamed) {
  write(weights);
  nn::LlamaConfig other = config;
  other.rope_theta = 10000.0;
  other.rms_norm_eps = 1e-6;
  testing::write_text(dir + "/config.json", testing::config_json(other));
  expect_import_error({"[nn.import]", "the model was built from a config that differs from",
                       "config.json", "rms_norm_eps: 1.0000000000000001e-05 (model) vs",
                       "rope_theta: 500 (model) vs 10000 (file)"});
}

// config.json says one model, the tensors another: named as a config/file mismatch with the
// sizes the tensors imply, not as a list of shape mismatches.
TEST_F(HfImport, ConfigThatDoesNotMatchTheFileIsNamed) {
  nn::LlamaConfig wide = config;
  wide.hidden_size = 32;  // 4 heads of 8; k_proj [2 * 8, 32]
  wide.intermediate_size = 48;
  wide.vocab_size = 50;
  LlamaUnderTest other(wide, 1, 4, 3);
  write(other.params());  // the folder's config.json is this model's (config)
  expect_import_error({"[nn.import]", "does not match the weights of its checkpoint",
                       "vocab_size is 40 in config.json, but model.embed_tokens.weight "
                       "(model.safetensors) is f32[50, 32]: vocab_size 50",
                       "hidden_size is 16 in config.json", "intermediate_size is 24",
                       "mlp.gate_proj.weight (model.safetensors) is f32[48, 32]",
                       "num_key_value_heads is 2 in config.json", "num_key_value_heads 4"});

  nn::LlamaConfig deeper = config;
  deeper.num_hidden_layers = 3;
  LlamaUnderTest three(deeper, 1, 4, 3);
  write(three.params());
  expect_import_error(
      {"num_hidden_layers is 2 in config.json, but the weights have "
       "model.layers.0 to 2",
       "num_hidden_layers 3"});
}

TEST_F(HfImport, ConfigJsonErrorsAreNamed) {
  write(weights);
  testing::write_text(dir + "/config.json", "{\"hidden_size\": ");
  expect_import_error({"[nn.llama_config]", "config.json: not a JSON object"});
  std::remove((dir + "/config.json").c_str());
  expect_import_error({"config.json"});
}

TEST_F(HfImport, CorruptIndexIsNamed) {
  write(weights, 2);
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string good = testing::read_text(index);
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"{\"weight_map\": {\"a\": ", {"model.safetensors.index.json' is not valid JSON"}},
      {"[1, 2]", {"is not a JSON object but array"}},
      {"{\"metadata\": {}}", {"has no \"weight_map\""}},
      {"{\"weight_map\": []}", {"\"weight_map\" is not an object but array"}},
      {"{\"weight_map\": {}}", {"\"weight_map\" is empty"}},
      {"{\"weight_map\": {\"lm_head.weight\": 3}}",
       {"\"weight_map\" entry 'lm_head.weight' is not a file name but 3"}},
      {"{\"weight_map\": {\"lm_head.weight\": \"../model-00001-of-00002.safetensors\"}}",
       {"names '../model-00001-of-00002.safetensors', which is not a file name in the "
        "checkpoint folder"}},
  };
  for (const auto& [text, fragments] : cases) {
    SCOPED_TRACE(text);
    testing::write_text(index, text);
    std::vector<std::string> f = fragments;
    f.push_back("[nn.import]");
    expect_import_error(f);
  }
  testing::write_text(index, good);
  import();
  expect_imported(weights);
}

TEST_F(HfImport, IndexNamingAMissingShardIsNamed) {
  write(weights, 3);
  std::remove((dir + "/model-00002-of-00003.safetensors").c_str());
  expect_import_error({"[nn.import]", "does not match its shards", "1 shard file(s) missing",
                       "'model-00002-of-00003.safetensors' (7 tensor(s), e.g. '"});
}

// The index and the shards disagree: a listed name that is not in its shard, a shard tensor
// the index does not list, one it places in another shard; all in one error.
TEST_F(HfImport, IndexAndShardsThatDisagreeAreAllListed) {
  write(weights, 2);
  const std::string index = dir + "/model.safetensors.index.json";
  std::string text = testing::read_text(index);
  auto drop_entry = [&](const std::string& name) {
    const size_t at = text.find("\"" + name + "\"");
    text.erase(at, text.find(',', at) + 2 - at);
  };
  drop_entry("model.layers.0.input_layernorm.weight");
  // model.norm.weight is in shard 1 or 2: point it at the other one.
  const std::string norm = "\"model.norm.weight\": \"model-0000";
  const size_t at = text.find(norm) + norm.size();
  text[at] = text[at] == '1' ? '2' : '1';
  text.insert(text.size() - 2, ", \"model.ghost.weight\": \"model-00001-of-00002.safetensors\"");
  testing::write_text(index, text);
  expect_import_error(
      {"[nn.import]", "does not match its shards", "2 weight-map name(s) missing from their shard",
       "'model.ghost.weight' is not in 'model-00001-of-00002.safetensors'",
       "'model.norm.weight' is not in 'model-0000",
       "2 shard tensor(s) the weight map does not place there",
       "'model.layers.0.input_layernorm.weight' in 'model-0000", "is not in the weight map",
       "'model.norm.weight' in 'model-0000", "is mapped to '"});
}

TEST_F(HfImport, TruncatedFilesAreNamed) {
  write(weights);
  const std::string file = dir + "/model.safetensors";
  const std::string bytes = testing::read_text(file);
  testing::write_text(file, bytes.substr(0, bytes.size() - 100));
  expect_import_error({"[nn.import]", "cannot read weights from",
                       "model.safetensors': [safetensors]", "end past the data buffer"});
  testing::write_text(file, bytes.substr(0, 5));
  expect_import_error({"file too short (5 bytes)"});

  std::remove(file.c_str());
  write(weights, 2);
  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  const std::string shard_bytes = testing::read_text(shard);
  testing::write_text(shard, shard_bytes.substr(0, shard_bytes.size() / 2));
  expect_import_error(
      {"cannot read weights from", "model-00002-of-00002.safetensors': [safetensors]"});
}

TEST_F(HfImport, FolderWithoutWeightsIsNamed) {
  testing::write_text(dir + "/config.json", testing::config_json(config));
  expect_import_error({"[nn.import]",
                       "has neither model.safetensors nor "
                       "model.safetensors.index.json"});
  testing::write_text(dir + "/pytorch_model.bin", "PK");
  expect_import_error({"PyTorch pickles are not read"});
  expect_error([] { nn::read_hf_checkpoint("/nonexistent/checkpoint"); },
               {"[nn.import]", "'/nonexistent/checkpoint' does not exist"});
}

// Both files in one folder: model.safetensors is read, as from_pretrained does.
TEST_F(HfImport, SingleFileWinsOverAnIndex) {
  write(weights, 2);
  std::map<std::string, Tensor> other = target->params();
  save_safetensors(dir + "/model.safetensors", other);
  nn::HfCheckpoint ck = nn::read_hf_checkpoint(dir);
  EXPECT_EQ(ck.files, (std::vector<std::string>{"model.safetensors"}));
}

// transformers 5 writes rope_theta inside "rope_parameters".
TEST(HfLlamaConfig, RopeParametersOfTransformers5) {
  const std::string base =
      R"({"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 40, )";
  auto parse = [&](const std::string& tail) {
    return nn::parse_llama_config(base + tail + "}", "v5.json");
  };
  EXPECT_EQ(
      parse(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})").rope_theta,
      500000.0);
  EXPECT_EQ(parse(R"("rope_theta": 250.0, "rope_parameters": {"rope_theta": 250})").rope_theta,
            250.0);
  expect_error(
      [&] {
        parse(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8})");
      },
      {"[nn.llama_config]", "v5.json: field 'rope_parameters'", "rope_type \"default\" only"});
  expect_error([&] { parse(R"("rope_parameters": {"rope_theta": 5e5, "factor": 8.0})"); },
               {"(key 'factor'; plain rope_theta only)"});
  // Without rope_theta, transformers takes its default, 10000.
  EXPECT_EQ(parse(R"("rope_parameters": {"rope_type": "default"})").rope_theta, 10000.0);
  // transformers 5 may echo the object as rope_scaling; the old spelling "type" is accepted.
  EXPECT_EQ(parse(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500},
                     "rope_scaling": {"type": "default", "rope_theta": 500})")
                .rope_theta,
            500.0);
  expect_error([&] { parse(R"("rope_scaling": {"type": "linear", "factor": 2.0})"); },
               {"field 'rope_scaling'", "rope_type \"default\" only"});
  expect_error(
      [&] {
        parse(R"("rope_parameters": {"rope_theta": 500}, "rope_scaling": {"rope_theta": 400})");
      },
      {"field 'rope_scaling.rope_theta' = 400 differs from the rope_theta given elsewhere (500)"});
  expect_error([&] { parse(R"("rope_parameters": {"rope_theta": -1})"); },
               {"'rope_parameters.rope_theta' must be a positive number, got -1"});
  expect_error([&] { parse(R"("rope_parameters": 7)"); },
               {"field 'rope_parameters' must be an object, got 7"});
  expect_error([&] { parse(R"("rope_theta": 10000.0, "rope_parameters": {"rope_theta": 500})"); },
               {"field 'rope_parameters.rope_theta' = 500 differs from the rope_theta given "
                "elsewhere (10000)"});
}

}  // namespace
}  // namespace qg
