// Linears that read one value share its GEMM-input chain (nn::GemmInputSharing, Builder::
// gemm_operand): on a tiny Llama, sharing the quantizer gives the same loss and the same
// parameter gradients bit for bit as one chain per linear (through autograd alone, and through
// compile()'s passes over Adam steps), for the 8da4w and w8a8_dynamic recipes and float, in f32
// and bf16-mixed; the shared graph has the expected dynamic_fake_quantize and cast nodes, the
// shared nodes keep the first linear's names; sharing the cast too keeps the forward and
// removes the casts but rounds the gradients in bf16; a bad operand is a named error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "autograd/grad.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using nn::GemmInputSharing;
using testing::expect_error;

constexpr int kLayers = 2;

nn::LlamaModel tiny(Graph& g, const std::string& recipe, const nn::PrecisionPolicy& precision,
                    GemmInputSharing sharing) {
  const std::string config = R"({"hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": )" +
                             std::to_string(kLayers) +
                             R"(, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 50, "max_position_embeddings": 16, "tie_word_embeddings": false})";
  return nn::build_llama(g, nn::parse_llama_config(config, "tiny"), 2, 7,
                         nn::parse_recipe(recipe, 32), 3, precision, sharing);
}

// Bit for bit, so that -0 and +0 or two NaN payloads would differ too.
void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  ASSERT_EQ(x.dtype(), y.dtype()) << what;
  ASSERT_EQ(x.shape(), y.shape()) << what;
  ASSERT_TRUE(x.is_contiguous() && y.is_contiguous()) << what;
  EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << what;
}

struct Variant {
  std::string recipe;
  nn::PrecisionPolicy precision;
  std::string label;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const std::string recipe : {"8da4w", "w8a8_dynamic", "float"}) {
    v.push_back({recipe, nn::PrecisionPolicy::f32(), recipe + " f32"});
    v.push_back({recipe, nn::PrecisionPolicy::bf16_mixed(), recipe + " bf16-mixed"});
  }
  return v;
}

// The loss and the gradient of every parameter, from autograd's graph run by the executor.
std::vector<Tensor> loss_and_gradients(const Variant& v, GemmInputSharing sharing) {
  Graph g;
  nn::LlamaModel m = tiny(g, v.recipe, v.precision, sharing);
  std::vector<ValueId> fetch = {m.loss};
  for (ValueId gr : grad(g, m.loss, m.parameters)) fetch.push_back(gr);
  Executor ex(g);
  return ex.run(testing::tiny_llama_feeds(), fetch);
}

TEST(GemmInputSharing, SharedQuantizerGivesTheSameLossAndGradientsBitForBit) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.label);
    const std::vector<Tensor> own = loss_and_gradients(v, GemmInputSharing::off);
    const std::vector<Tensor> shared = loss_and_gradients(v, GemmInputSharing::quantizer);
    ASSERT_EQ(own.size(), shared.size());
    for (size_t i = 0; i < own.size(); ++i)
      expect_bits_equal(own[i], shared[i], i == 0 ? "loss" : "gradient " + std::to_string(i - 1));
    // Not trivially equal: every parameter gets some gradient.
    for (size_t i = 1; i < own.size(); ++i) {
      double sum = 0;
      for (double x : own[i].to_doubles()) sum += std::fabs(x);
      EXPECT_GT(sum, 0.0) << "gradient " << i - 1;
    }
  }
}

// Through compile() (its fusion passes and the fused optimizer), three Adam steps: the losses
// of every step and every parameter after them, bit for bit.
TEST(GemmInputSharing, SharedQuantizerTrainsBitForBitThroughCompile) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.label);
    std::map<GemmInputSharing, std::vector<Tensor>> losses;
    std::map<GemmInputSharing, std::map<std::string, Tensor>> states;
    for (GemmInputSharing sharing : {GemmInputSharing::off, GemmInputSharing::quantizer}) {
      Graph g;
      nn::LlamaModel m = tiny(g, v.recipe, v.precision, sharing);
      CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, {});
      for (int s = 0; s < 3; ++s)
        losses[sharing].push_back(step.train(testing::tiny_llama_feeds(), {m.loss})[0]);
      step.synchronize();
      for (const auto& [key, t] : state_index(step.executor()))
        states[sharing].emplace(key, t->to(Device::cpu()));
    }
    for (int s = 0; s < 3; ++s)
      expect_bits_equal(losses[GemmInputSharing::off][s], losses[GemmInputSharing::quantizer][s],
                        "loss of step " + std::to_string(s));
    const auto& own = states[GemmInputSharing::off];
    const auto& shared = states[GemmInputSharing::quantizer];
    ASSERT_EQ(own.size(), shared.size());
    for (const auto& [key, t] : own) {
      auto it = shared.find(key);
      ASSERT_NE(it, shared.end()) << key;
      expect_bits_equal(t, it->second, key);
    }
  }
}

// Per layer one activation quantizer for q/k/v, one for o_proj, one for gate/up and one for
// down_proj, plus its seven weight quantizers; then lm_head's input and weight. Input casts
// (bf16-mixed): o_proj and down_proj read bf16 values already, so per layer q, k, v, gate and
// up have one each, plus lm_head; sharing the quantizer leaves them so, sharing the cast too
// leaves one for q/k/v and one for gate/up.
TEST(GemmInputSharing, NodeCountsOfThe8da4wLlama) {
  const int linears = 7 * kLayers + 1;
  struct Count {
    GemmInputSharing sharing;
    int dfq, input_casts;
  };
  for (const Count& c :
       {Count{GemmInputSharing::off, 2 * linears, 5 * kLayers + 1},
        Count{GemmInputSharing::quantizer, 4 * kLayers + 1 + linears, 5 * kLayers + 1},
        Count{GemmInputSharing::with_cast, 4 * kLayers + 1 + linears, 2 * kLayers + 1}}) {
    SCOPED_TRACE(static_cast<int>(c.sharing));
    Graph g;
    nn::LlamaModel m = tiny(g, "8da4w", nn::PrecisionPolicy::bf16_mixed(), c.sharing);
    EXPECT_EQ(testing::count_live_ops(g, "dynamic_fake_quantize"), c.dfq);
    // Every cast: the GEMM inputs', one per weight (to bf16), and the attention and MLP
    // outputs' back to f32 before each residual add.
    const int weight_casts = linears, residual_casts = 2 * kLayers;
    EXPECT_EQ(testing::count_live_ops(g, "cast"), c.input_casts + weight_casts + residual_casts);
    int named_input_casts = 0;
    for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
      const Node& n = g.node(id);
      const std::string suffix = ".in.to_compute";
      named_input_casts +=
          n.op->name == "cast" && n.name.size() > suffix.size() &&
          n.name.compare(n.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    }
    EXPECT_EQ(named_input_casts, c.input_casts);
  }
}

// The shared nodes carry the first reader's names, and every sharing linear's matmul reads
// the shared quantizer's output.
TEST(GemmInputSharing, SharedNodesKeepTheFirstLinearsNames) {
  Graph g;
  nn::LlamaModel m = tiny(g, "8da4w", nn::PrecisionPolicy::f32(), GemmInputSharing::quantizer);
  std::map<std::string, const Node*> by_name;
  for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id)
    by_name[g.node(id).name] = &g.node(id);
  const std::string attn = "model.layers.0.self_attn.", mlp = "model.layers.0.mlp.";
  for (const std::string& first : {attn + "q_proj", mlp + "gate_proj"})
    ASSERT_TRUE(by_name.count(first + ".in.dfq")) << first;
  for (const std::string& later : {attn + "k_proj", attn + "v_proj", mlp + "up_proj"}) {
    EXPECT_FALSE(by_name.count(later + ".in.dfq")) << later;
    EXPECT_FALSE(by_name.count(later + ".flatten")) << later;
  }
  // The flatten comes first (nn/gemm_operand.cpp), so the matmuls read the quantizer's y.
  const ValueId qkv = by_name.at(attn + "q_proj.in.dfq")->outputs[0];
  EXPECT_EQ(by_name.at(attn + "q_proj.in.dfq")->inputs[0],
            by_name.at(attn + "q_proj.flatten")->outputs[0]);
  for (const char* proj : {"q_proj", "k_proj", "v_proj"})
    EXPECT_EQ(by_name.at(attn + proj + ".matmul")->inputs[0], qkv) << proj;
  const ValueId gate_up = by_name.at(mlp + "gate_proj.in.dfq")->outputs[0];
  for (const char* proj : {"gate_proj", "up_proj"})
    EXPECT_EQ(by_name.at(mlp + proj + ".matmul")->inputs[0], gate_up) << proj;
  // o_proj and down_proj read values of their own.
  EXPECT_TRUE(by_name.count(attn + "o_proj.in.dfq"));
  EXPECT_TRUE(by_name.count(mlp + "down_proj.in.dfq"));
}

// Sharing the cast too: the forward is unchanged bit for bit, but the branches' gradients
// meet in bf16 before the cast back (nn/gemm_operand.cpp), so some parameter gradients round
// differently from one chain per linear.
TEST(GemmInputSharing, SharedCastKeepsTheForwardButNotTheGradients) {
  for (const std::string recipe : {"8da4w", "float"}) {
    SCOPED_TRACE(recipe);
    const Variant v{recipe, nn::PrecisionPolicy::bf16_mixed(), recipe};
    const std::vector<Tensor> own = loss_and_gradients(v, GemmInputSharing::off);
    const std::vector<Tensor> shared = loss_and_gradients(v, GemmInputSharing::with_cast);
    expect_bits_equal(own[0], shared[0], "loss");
    int differing = 0;
    for (size_t i = 1; i < own.size(); ++i)
      differing += std::memcmp(own[i].raw_data(), shared[i].raw_data(), own[i].nbytes()) != 0;
    EXPECT_GT(differing, 0);
  }
}

TEST(GemmInputSharing, SharedCastKeepsTheLogits) {
  for (const std::string recipe : {"8da4w", "float"}) {
    SCOPED_TRACE(recipe);
    std::vector<Tensor> out;
    for (GemmInputSharing sharing : {GemmInputSharing::off, GemmInputSharing::with_cast}) {
      Graph g;
      nn::LlamaModel m = tiny(g, recipe, nn::PrecisionPolicy::bf16_mixed(), sharing);
      Executor ex(g);
      std::vector<Tensor> r = ex.run(testing::tiny_llama_feeds(), {m.loss, m.logits});
      out.insert(out.end(), r.begin(), r.end());
    }
    expect_bits_equal(out[0], out[2], "loss");
    expect_bits_equal(out[1], out[3], "logits");
  }
}

// Without dynamic activations there is nothing to share: a static-activation model builds the
// same graph whatever the mode.
TEST(GemmInputSharing, NothingIsSharedWithoutAQuantizerOrCast) {
  std::vector<std::string> dumps;
  for (GemmInputSharing sharing : {GemmInputSharing::off, GemmInputSharing::quantizer}) {
    Graph g;
    tiny(g, "float", nn::PrecisionPolicy::bf16_mixed(), sharing);
    dumps.push_back(g.dump());
  }
  EXPECT_EQ(dumps[0], dumps[1]);
}

TEST(GemmInputSharing, AnOperandOfRankBelowTwoIsANamedError) {
  Graph g;
  nn::Builder b(g, nn::parse_recipe("8da4w", 32), 1);
  ValueId x = g.input("x", {DType::f32, {8}});
  expect_error([&] { b.gemm_operand(x, "fc"); }, {"nn.gemm_operand", "fc", "rank >= 2"});
}

}  // namespace
}  // namespace qg
