// The Llama decoder's quantized token embedding (QConfig::embedding_weight,
// nn/llama_embedding.h): its forward is the float model's with the table fake-quantized by hand
// (torchao's symmetric per-group formula) and gathered, bit for bit, in f32 and bf16-mixed,
// under float and quantized GEMM recipes; the table's gradient is the float model's through the
// straight-through mask; a tied lm_head reads the one shared quantizer; the model trains;
// conversion to integer codes keeps the logits bit for bit; bad group sizes, bit widths, tied
// mismatches and checkpoints of another embedding recipe are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "autograd/grad.h"
#include "nn/convert.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "nn/llama_embedding.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/lm_trainer.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

constexpr int64_t kHidden = 64;

nn::LlamaConfig tiny_config(bool tied = false) {
  return nn::parse_llama_config(std::string(R"({"hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 50, "max_position_embeddings": 16, "tie_word_embeddings": )") +
                                    (tied ? "true" : "false") + "}",
                                "tiny");
}

nn::QConfig with_embedding(nn::QConfig qc, nn::WeightQuant bits, int group) {
  qc.embedding_weight = bits;
  qc.embedding_group_size = group;
  return qc;
}

void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  ASSERT_EQ(x.dtype(), y.dtype()) << what;
  ASSERT_EQ(x.shape(), y.shape()) << what;
  EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << what;
}

// torchao's symmetric per-group fake-quant of an f32 [rows, width] table, written out:
// scale = max(|min(g, 0)|, max(g, 0)) * (1 / ((qmax - qmin) / 2)) in f32, at least f32's
// smallest normal; y = clamp(rint(x * (1 / scale)), qmin, qmax) * scale. `in_range` receives
// whether each code was within [qmin, qmax] before the clamp (the STE's mask).
std::vector<float> fake_quantized_table(const std::vector<float>& x, int64_t group, int bits,
                                        std::vector<bool>* in_range) {
  const float qmin = -std::ldexp(1.0f, bits - 1), qmax = std::ldexp(1.0f, bits - 1) - 1;
  const float inv_half_range = static_cast<float>(1.0 / ((qmax - qmin) / 2.0));
  std::vector<float> y(x.size());
  in_range->assign(x.size(), false);
  for (size_t g0 = 0; g0 < x.size(); g0 += static_cast<size_t>(group)) {
    float amax = 0;
    for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[g0 + i]));
    float scale = amax * inv_half_range;
    scale = std::max(scale, std::numeric_limits<float>::min());
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < group; ++i) {
      const float r = std::nearbyint(x[g0 + i] * inv);
      (*in_range)[g0 + i] = r >= qmin && r <= qmax;
      y[g0 + i] = std::min(std::max(r, qmin), qmax) * scale;
    }
  }
  return y;
}

std::vector<float> floats_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// The loss, the logits and every parameter's gradient (autograd's graph, one executor run),
// with the embedding table replaced by `table` when given.
struct ModelRun {
  std::vector<Tensor> gradients;
  Tensor loss, logits, table;
};
ModelRun run(const nn::LlamaConfig& config, const nn::QConfig& qc,
             const nn::PrecisionPolicy& precision, const std::vector<float>* table = nullptr) {
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, config, 2, 7, qc, 3, precision);
  std::vector<ValueId> fetch = {m.loss, m.logits};
  for (ValueId gr : grad(g, m.loss, m.parameters)) fetch.push_back(gr);
  Executor ex(g);
  Tensor& t = ex.parameter("model.embed_tokens.weight");
  if (table != nullptr) std::memcpy(t.raw_data(), table->data(), t.nbytes());
  ModelRun r;
  r.table = t.to(Device::cpu());
  std::vector<Tensor> got = ex.run(testing::tiny_llama_feeds(), fetch);
  r.loss = got[0];
  r.logits = got[1];
  r.gradients.assign(got.begin() + 2, got.end());
  return r;
}

struct ForwardCase {
  std::string recipe;
  nn::WeightQuant bits;
  int group;  // 256: wider than the hidden size, one group per row
  bool tied;
};

TEST(LlamaEmbeddingQuant, ForwardAndGradientsAreTheFakeQuantizedTableGathered) {
  const std::vector<ForwardCase> cases = {{"float", nn::WeightQuant::int4, 32, false},
                                          {"8da4w", nn::WeightQuant::int4, 32, false},
                                          {"w8a8_dynamic", nn::WeightQuant::int8, 16, false},
                                          {"8da4w", nn::WeightQuant::int8, 256, false},
                                          {"float", nn::WeightQuant::int4, 64, true},
                                          {"float", nn::WeightQuant::int8, 32, true}};
  for (const ForwardCase& c : cases)
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::PrecisionPolicy::bf16_mixed()}) {
      SCOPED_TRACE(c.recipe + " embedding " + nn::weight_quant_name(c.bits) + " group " +
                   std::to_string(c.group) + (c.tied ? " tied" : "") + " " + precision.name());
      const nn::LlamaConfig config = tiny_config(c.tied);
      const nn::QConfig gemm = nn::parse_recipe(c.recipe, 32);
      const ModelRun quantized = run(config, with_embedding(gemm, c.bits, c.group), precision);
      const int bits = c.bits == nn::WeightQuant::int4 ? 4 : 8;
      std::vector<bool> in_range;
      const std::vector<float> table_q = fake_quantized_table(
          floats_of(quantized.table), std::min<int64_t>(c.group, kHidden), bits, &in_range);
      // The float-embedding model (same seed, same parameters) reading the table quantized by
      // hand.
      const ModelRun reference = run(config, gemm, precision, &table_q);
      expect_bits_equal(quantized.logits, reference.logits, "logits");
      expect_bits_equal(quantized.loss, reference.loss, "loss");
      ASSERT_EQ(quantized.gradients.size(), reference.gradients.size());
      // Parameter 0 is the table: its gradient is the reference's where the code was in range
      // (the straight-through estimator), 0 elsewhere; every other gradient is the same.
      const std::vector<float> gq = floats_of(quantized.gradients[0]),
                               gr = floats_of(reference.gradients[0]);
      int64_t nonzero = 0, masked = 0;
      for (size_t i = 0; i < gq.size(); ++i) {
        const float want = in_range[i] ? gr[i] : 0.0f;
        ASSERT_EQ(std::memcmp(&gq[i], &want, sizeof(float)), 0) << "table gradient " << i;
        nonzero += gq[i] != 0;
        masked += !in_range[i];
      }
      EXPECT_GT(nonzero, kHidden);  // the batch's tokens' rows (and all of them when tied)
      EXPECT_GT(masked, 0);         // each group's largest magnitude rounds past qmax
      for (size_t p = 1; p < quantized.gradients.size(); ++p)
        expect_bits_equal(quantized.gradients[p], reference.gradients[p],
                          "gradient " + std::to_string(p));
    }
}

TEST(LlamaEmbeddingQuant, FloatEmbeddingLeavesTheGraphAsItWas) {
  for (bool tied : {false, true}) {
    Graph a, b;
    nn::build_llama(a, tiny_config(tied), 2, 7, nn::parse_recipe("8da4w", 32), 3);
    nn::LlamaModel m = nn::build_llama(
        b, tiny_config(tied), 2, 7,
        with_embedding(nn::parse_recipe("8da4w", 32), nn::WeightQuant::none, 16), 3);
    EXPECT_EQ(a.num_nodes(), b.num_nodes());
    EXPECT_TRUE(m.embedding_weights.empty());
  }
  EXPECT_EQ(nn::parse_recipe("8da4w", 32).str(), nn::parse_recipe("8da4w", 32).gemm_str());
  EXPECT_EQ(with_embedding(nn::QConfig::float32(), nn::WeightQuant::int4, 32).str(),
            "float32 + embedding int4 per group of 32");
}

TEST(LlamaEmbeddingQuant, DescriptionReadsBack) {
  for (const nn::QConfig& qc :
       {with_embedding(nn::parse_recipe("8da4w", 64), nn::WeightQuant::int4, 32),
        with_embedding(nn::QConfig::float32(), nn::WeightQuant::int8, 256),
        nn::parse_recipe("w8a8_dynamic", 32)}) {
    nn::QConfig back;
    back.embedding_weight = nn::WeightQuant::int8;  // overwritten either way
    EXPECT_EQ(nn::read_embedding_str(qc.str(), back), qc.gemm_str());
    EXPECT_EQ(back.embedding_weight, qc.embedding_weight);
    if (qc.embedding_quantized()) {
      EXPECT_EQ(back.embedding_group_size, qc.embedding_group_size);
    }
  }
  nn::QConfig back;
  for (const std::string bad :
       {"float32 + embedding int4", "float32 + embedding int4 per group of ",
        "float32 + embedding int2 per group of 32", "float32 + embedding int4 per group of 0",
        "float32 + embedding int4 per group of 3x"})
    expect_error([&] { nn::read_embedding_str(bad, back); }, {"[qconfig]", bad});
}

TEST(LlamaEmbeddingQuant, TiedEmbeddingsShareOneQuantizerWithLmHead) {
  const nn::QConfig qc = with_embedding(nn::parse_recipe("8da4w", 32), nn::WeightQuant::int4, 32);
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, tiny_config(true), 2, 7, qc, 3);
  ASSERT_EQ(m.embedding_weights.size(), 1u);
  // One fake-quant reads the table; the gather and lm_head's matmul both read its output.
  const ValueId table = m.embedding_weights[0].source;
  int table_readers = 0;
  for (NodeId c : g.consumers(table)) table_readers += !g.node(c).dead;
  EXPECT_EQ(table_readers, 1);
  std::vector<std::string> readers;
  for (NodeId c : g.consumers(m.embedding_weights[0].quantized)) readers.push_back(g.node(c).name);
  EXPECT_EQ(readers, (std::vector<std::string>{"model.embed_tokens", "lm_head.matmul"}));
  for (const nn::WeightQuantizer& w : m.weights) EXPECT_NE(w.layer, "lm_head");
}

TEST(LlamaEmbeddingQuant, TrainingOnTheTinyBatchLowersTheLoss) {
  for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::PrecisionPolicy::bf16_mixed()}) {
    SCOPED_TRACE(precision.name());
    Graph g;
    const nn::QConfig qc = with_embedding(nn::parse_recipe("8da4w", 32), nn::WeightQuant::int4, 32);
    nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 5, precision);
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
    const Tensor before = step.executor().parameter("model.embed_tokens.weight").to(Device::cpu());
    std::vector<double> losses;
    for (int s = 0; s < 12; ++s)
      losses.push_back(
          step.train(testing::tiny_llama_feeds(), {m.loss})[0].to(Device::cpu()).to_doubles()[0]);
    step.synchronize();
    EXPECT_LT(losses.back(), 0.7 * losses.front());
    const Tensor after = step.executor().parameter("model.embed_tokens.weight").to(Device::cpu());
    EXPECT_NE(std::memcmp(before.raw_data(), after.raw_data(), before.nbytes()), 0);
  }
}

// A model trained a few Adam steps, copied into a forward-only instance.
nn::LlamaInstance trained_instance(const nn::LlamaConfig& config, const nn::QConfig& qc,
                                   const nn::PrecisionPolicy& precision,
                                   Device device = Device::cpu()) {
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, config, 2, 7, qc, 5, precision);
  CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
  for (int s = 0; s < 4; ++s) step.train(testing::tiny_llama_feeds(), {m.loss});
  step.synchronize();
  nn::LlamaInstance inst = nn::build_llama_instance(config, 2, 7, qc, device, precision);
  nn::copy_states(step.executor(), *inst.exec);
  return inst;
}

Tensor logits(nn::LlamaInstance& inst) {
  inst.exec->set_training(false);
  return inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
}

struct ConvertCase {
  std::string recipe;
  nn::WeightQuant bits;
  int group;
  bool tied;
  const char* dequantize;  // the embedding codes' storage op
};

TEST(LlamaEmbeddingQuant, ConvertedLogitsEqualTheQatLogitsBitForBit) {
  const std::vector<ConvertCase> cases = {
      {"float", nn::WeightQuant::int4, 32, false, "int4_unpack_dequantize"},
      {"8da4w", nn::WeightQuant::int4, 32, false, "int4_unpack_dequantize"},
      {"w8a8_dynamic", nn::WeightQuant::int8, 16, false, "dequantize"},
      {"8da4w", nn::WeightQuant::int8, 256, false, "dequantize"},
      {"8da4w", nn::WeightQuant::int4, 32, true, "int4_unpack_dequantize"},
      {"float", nn::WeightQuant::int8, 64, true, "dequantize"}};
  for (const ConvertCase& c : cases)
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::PrecisionPolicy::bf16_mixed()}) {
      SCOPED_TRACE(c.recipe + " embedding " + nn::weight_quant_name(c.bits) + " group " +
                   std::to_string(c.group) + (c.tied ? " tied" : "") + " " + precision.name());
      const nn::QConfig qc = with_embedding(nn::parse_recipe(c.recipe, 32), c.bits, c.group);
      nn::LlamaInstance inst = trained_instance(tiny_config(c.tied), qc, precision);
      const Tensor qat = logits(inst);
      nn::convert_to_integer(inst, qc);
      expect_bits_equal(logits(inst), qat, "logits");
      // The gather reads the codes' dequantize; neither the float table nor its fake-quant
      // feeds the logits any more (a tied lm_head reads the same codes).
      const Graph& g = *inst.graph;
      std::vector<bool> needed = g.needed_nodes({inst.model.logits});
      const nn::WeightQuantizer& w = inst.model.embedding_weights.at(0);
      EXPECT_FALSE(needed[g.value(w.source).producer]);
      EXPECT_FALSE(needed[g.value(w.quantized).producer]);
      int gathers = 0;
      for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
        const Node& n = g.node(id);
        if (!needed[id] || n.name != "model.embed_tokens") continue;
        ++gathers;
        const Node& table = g.node(g.value(n.inputs[0]).producer);
        EXPECT_EQ(table.op->name, c.dequantize);
        EXPECT_EQ(table.name, "model.embed_tokens.weight.int.dequantize");
      }
      EXPECT_EQ(gathers, 1);
    }
}

// On a GPU the codes' dequantize computes code * scale in f32 as the fake-quant does, so the
// converted CUDA logits equal the QAT model's CUDA logits bit for bit too.
TEST(LlamaEmbeddingQuant, OnTheGpuConvertedLogitsEqualTheQatLogitsBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  for (const auto& [bits, tied] :
       {std::pair{nn::WeightQuant::int4, false}, std::pair{nn::WeightQuant::int8, false},
        std::pair{nn::WeightQuant::int4, true}})
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::PrecisionPolicy::bf16_mixed()}) {
      SCOPED_TRACE(nn::weight_quant_name(bits) + (tied ? " tied " : " ") + precision.name());
      const nn::QConfig qc = with_embedding(nn::parse_recipe("8da4w", 32), bits, 32);
      nn::LlamaInstance inst = trained_instance(tiny_config(tied), qc, precision, Device::cuda(0));
      const Tensor qat = logits(inst);
      nn::convert_to_integer(inst, qc);
      expect_bits_equal(logits(inst), qat, "logits");
    }
}

TEST(LlamaEmbeddingQuant, BadSettingsAreNamedErrors) {
  // A group that does not split the hidden size.
  expect_error(
      [&] {
        Graph g;
        nn::build_llama(g, tiny_config(), 2, 7,
                        with_embedding(nn::QConfig::float32(), nn::WeightQuant::int4, 48), 1);
      },
      {"[nn.llama]", "embedding group size 48 does not divide hidden_size 64"});
  // Bit widths outside the embedding recipes.
  expect_error(
      [&] {
        Graph g;
        nn::build_llama(g, tiny_config(), 2, 7,
                        with_embedding(nn::QConfig::float32(), nn::WeightQuant::int2, 32), 1);
      },
      {"[qconfig]", "embedding weights int2", "none (float), int8 or int4"});
  expect_error([&] { nn::parse_embedding_quant("int3"); },
               {"[qconfig]", "'int3' is not one of none, int8, int4"});
  expect_error([&] { with_embedding(nn::QConfig::float32(), nn::WeightQuant::int4, 0).validate(); },
               {"[qconfig]", "embedding group size 0 must be positive"});
  expect_error([&] { nn::embedding_weight_qconfig(nn::QConfig::float32()); },
               {"[qconfig]", "has no quantized embedding"});
  // Tied embeddings whose lm_head quantizer is not the embedding's: other group, other bits,
  // asymmetric codes with a float zero point.
  struct Tied {
    std::string recipe;
    nn::WeightQuant bits;
    int group;
  };
  for (const Tied& t :
       {Tied{"8da4w", nn::WeightQuant::int4, 64}, Tied{"8da4w", nn::WeightQuant::int8, 32},
        Tied{"w8a8_dynamic", nn::WeightQuant::int8, 32},
        Tied{"int4_weight_only", nn::WeightQuant::int4, 32}}) {
    SCOPED_TRACE(t.recipe);
    expect_error(
        [&] {
          Graph g;
          nn::build_llama(g, tiny_config(true), 2, 7,
                          with_embedding(nn::parse_recipe(t.recipe, 32), t.bits, t.group), 1);
        },
        {"[nn.llama]", "tied embeddings share one quantizer", "untie the embeddings"});
  }
  // w8a8_dynamic's per-channel int8 is the embedding's int8 with one group per row.
  Graph g;
  nn::build_llama(g, tiny_config(true), 2, 7,
                  with_embedding(nn::parse_recipe("w8a8_dynamic", 32), nn::WeightQuant::int8, 64),
                  1);
}

std::vector<int32_t> pattern(size_t n, int32_t vocab) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i % 5) * 3 % vocab);
  return s;
}

TEST(LlamaEmbeddingQuant, CheckpointOfAnotherEmbeddingRecipeIsRefused) {
  namespace fs = std::filesystem;
  std::vector<int32_t> train = pattern(400, 50), valid = pattern(64, 50);
  nn::LmTrainConfig c;
  c.model = tiny_config();
  c.batch = 2;
  c.seq = 8;
  c.lr = {3e-3, 2, 8, 0.1, 4};
  c.qconfig = with_embedding(nn::parse_recipe("8da4w", 32), nn::WeightQuant::int4, 32);
  nn::LmTrainer a(c, train, valid);
  a.train_step();
  const std::string path = (fs::temp_directory_path() / "qg_lm_embedding.qgck").string();
  a.save_checkpoint(path);
  // The same recipe resumes; another embedding group, bit width or a float embedding does not.
  nn::LmTrainer same(c, train, valid);
  same.load_checkpoint(path);
  EXPECT_EQ(same.step(), 1);
  for (const nn::QConfig& other :
       {with_embedding(c.qconfig, nn::WeightQuant::int4, 16),
        with_embedding(c.qconfig, nn::WeightQuant::int8, 32), nn::parse_recipe("8da4w", 32)}) {
    SCOPED_TRACE(other.str());
    nn::LmTrainConfig o = c;
    o.qconfig = other;
    nn::LmTrainer b(o, train, valid);
    expect_error([&] { b.load_checkpoint(path); },
                 {"[checkpoint]", "+ embedding int4", other.str()});
  }
  fs::remove(path);
}

}  // namespace
}  // namespace qg
