// The fuse_multi_tensor_adamw pass (ops/fused/multi_tensor_adamw): the adamw steps of a graph
// that share rate, scale and hyper-parameters become one node per group; a model trained with
// it ends with every parameter and optimizer state bit-identical to the unfused steps (f32
// and f64, decoupled and L2 decay, clipping on and off), under the same state keys; a bad rate
// changes nothing; steps with other hyper-parameters stay apart. On a GPU the multi-tensor
// CUDA kernel (tables of kMultiTensorChunk tensors) is bit-identical to the unfused CUDA steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/graph_rewrite.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/passes/pass.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::count_live_ops;

nn::LlamaConfig tiny_config() {
  return testing::tiny_llama_config(2);
}

struct Trained {
  Graph g;
  std::unique_ptr<CompiledStep> step;
};

// The tiny Llama trained `steps` AdamW steps on `device`, with or without the pass.
void train(Trained& t, const nn::OptimizerConfig& opt, bool fused, Device device, int steps = 4) {
  nn::LlamaModel m = nn::build_llama(t.g, tiny_config(), 2, 7, nn::QConfig::float32(), 5);
  CompileOptions options;
  options.device = device;
  if (!fused) options.passes.disabled = {"fuse_multi_tensor_adamw"};
  t.step = std::make_unique<CompiledStep>(
      t.g, TrainingSpec{m.loss, m.parameters, nn::optimizer_nodes(opt), {}}, options);
  for (int s = 0; s < steps; ++s) t.step->train(testing::tiny_llama_feeds(), {m.loss});
  t.step->synchronize();
}

void expect_same_states(Trained& a, Trained& b) {
  auto sa = state_index(a.step->executor()), sb = state_index(b.step->executor());
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) {
    ASSERT_TRUE(sb.count(key)) << key;
    const Tensor x = t->to(Device::cpu()), y = sb.at(key)->to(Device::cpu());
    ASSERT_EQ(x.nbytes(), y.nbytes()) << key;
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << key;
  }
}

nn::OptimizerConfig adamw(double wd, double clip) {
  nn::OptimizerConfig o;
  o.kind = "adamw";
  o.lr = 3e-3;
  o.weight_decay = wd;
  o.clip_grad_norm = clip;
  return o;
}

TEST(MultiTensorAdamw, TrainsBitForBitAsTheUnfusedSteps) {
  for (const auto& opt : {adamw(0.1, 0.0), adamw(0.1, 0.5), adamw(0.0, 1.0)}) {
    SCOPED_TRACE("wd " + std::to_string(opt.weight_decay) + " clip " +
                 std::to_string(opt.clip_grad_norm));
    Trained plain, fused;
    train(plain, opt, false, Device::cpu());
    train(fused, opt, true, Device::cpu());
    // One node holds every step: 2 layers x 9 weights + the embedding, the final norm and the
    // lm_head.
    EXPECT_EQ(count_live_ops(fused.g, "fused_multi_tensor_adamw"), 1);
    EXPECT_EQ(count_live_ops(fused.g, "adamw"), 0);
    EXPECT_EQ(count_live_ops(plain.g, "adamw"), 21);
    EXPECT_EQ(fused.step->updates().size(), 1u);
    expect_same_states(plain, fused);
  }
}

// Parameters whose gradients are fed, each with an adamw step as a caller writes them.
struct Steps {
  Graph g;
  std::vector<NodeId> updates;
  Executor::Feeds feeds;
  Steps(DType dtype, const std::vector<double>& decays, bool decoupled) {
    ValueId lr = g.variable("lr", Tensor::from_doubles({1}, {1e-2}, DType::f64));
    ValueId scale = g.constant(Tensor::from_doubles({1}, {1.0}, DType::f32), "scale");
    for (size_t k = 0; k < decays.size(); ++k) {
      const int64_t n = 3 + static_cast<int64_t>(k) * 5;
      std::vector<double> init(static_cast<size_t>(n)), grad(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        init[i] = std::sin(0.7 * static_cast<double>(i + 3 * k));
        grad[i] = std::cos(1.3 * static_cast<double>(i * k + 1));
      }
      const std::string name = std::to_string(k);
      ValueId p = g.parameter("p" + name, Tensor::from_doubles({n}, init, dtype));
      ValueId gv = g.input("g" + name, {dtype, {n}});
      feeds["g" + name] = Tensor::from_doubles({n}, grad, dtype);
      g.apply("adamw", {p, gv, lr, scale}, {{"weight_decay", decays[k]}, {"decoupled", decoupled}},
              "step" + name);
      updates.push_back(static_cast<NodeId>(g.num_nodes() - 1));
    }
  }
  // Runs `steps` updates; the targets are the live nodes that took the steps in.
  void run(Executor& ex, int steps) {
    std::vector<NodeId> targets;
    for (NodeId u : updates) {
      const NodeId n = live_node(g, u);
      if (std::find(targets.begin(), targets.end(), n) == targets.end()) targets.push_back(n);
    }
    for (int s = 0; s < steps; ++s) ex.run(feeds, {}, targets);
  }
};

TEST(MultiTensorAdamw, GroupsStepsBySharedHyperParameters) {
  for (DType dtype : {DType::f32, DType::f64})
    for (bool decoupled : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (decoupled ? " decoupled" : " L2"));
      const std::vector<double> decays = {0.01, 0.0, 0.01, 0.01};
      Steps plain(dtype, decays, decoupled), fused(dtype, decays, decoupled);
      const std::vector<PassRecord> records = optimize(fused.g, PassOptions{});
      EXPECT_EQ(records.back().name, "fuse_multi_tensor_adamw");
      EXPECT_EQ(records.back().rewrites, 1);  // steps 0, 2, 3; step 1 (no decay) alone
      EXPECT_EQ(count_live_ops(fused.g, "fused_multi_tensor_adamw"), 1);
      EXPECT_EQ(count_live_ops(fused.g, "adamw"), 1);
      EXPECT_EQ(live_node(fused.g, fused.updates[2]), fused.updates[0]);
      EXPECT_EQ(live_node(fused.g, fused.updates[1]), fused.updates[1]);
      Executor ep(plain.g, Device::cpu()), ef(fused.g, Device::cpu());
      plain.run(ep, 3);
      fused.run(ef, 3);
      for (size_t k = 0; k < decays.size(); ++k) {
        const Tensor& a = ep.parameter("p" + std::to_string(k));
        const Tensor& b = ef.parameter("p" + std::to_string(k));
        EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << k;
      }
      auto sp = state_index(ep), sf = state_index(ef);
      ASSERT_EQ(sp.size(), sf.size());
      for (const auto& [key, t] : sp) {
        ASSERT_TRUE(sf.count(key)) << key;
        EXPECT_EQ(std::memcmp(t->raw_data(), sf.at(key)->raw_data(), t->nbytes()), 0) << key;
      }
    }
}

// A negative rate is the adamw kernel's named error, raised before any part is updated: every
// parameter and state stays as it was.
TEST(MultiTensorAdamw, ABadRateChangesNothing) {
  Steps fused(DType::f32, {0.01, 0.01, 0.01}, true);
  optimize(fused.g, PassOptions{});
  Executor ex(fused.g, Device::cpu());
  fused.run(ex, 1);
  std::map<std::string, std::vector<uint8_t>> before;
  for (const auto& [key, t] : state_index(ex)) {
    const auto* b = static_cast<const uint8_t*>(t->raw_data());
    before[key].assign(b, b + t->nbytes());
  }
  // The rate variable written directly (nn::set_learning_rate refuses a negative rate).
  *ex.state(fused.g.value(fused.g.find("lr")).producer, "value").data<double>() = -1.0;
  testing::expect_error([&] { fused.run(ex, 1); },
                        {"adamw", "learning rate -1", "the step was skipped"});
  for (const auto& [key, t] : state_index(ex)) {
    if (key.find("lr") != std::string::npos) continue;
    EXPECT_EQ(std::memcmp(t->raw_data(), before.at(key).data(), t->nbytes()), 0) << key;
  }
}

// On a GPU: 60 parameters (two tables of kMultiTensorChunk and a remainder) of 1 to 5000
// elements, and the tiny Llama, fused against the unfused CUDA steps, bit for bit.
TEST(MultiTensorAdamwCuda, MatchesTheUnfusedStepsBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  std::vector<double> decays(60, 0.05);
  Steps plain(DType::f32, decays, true), fused(DType::f32, decays, true);
  optimize(fused.g, PassOptions{});
  ASSERT_EQ(count_live_ops(fused.g, "adamw"), 0);
  Executor ep(plain.g, Device::cuda(0)), ef(fused.g, Device::cuda(0));
  plain.run(ep, 3);
  fused.run(ef, 3);
  auto sp = state_index(ep), sf = state_index(ef);
  for (const auto& [key, t] : sp) {
    const Tensor x = t->to(Device::cpu()), y = sf.at(key)->to(Device::cpu());
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << key;
  }
  Trained a, b;
  train(a, adamw(0.1, 0.5), false, Device::cuda(0));
  train(b, adamw(0.1, 0.5), true, Device::cuda(0));
  EXPECT_EQ(count_live_ops(b.g, "fused_multi_tensor_adamw"), 1);
  expect_same_states(a, b);
}

}  // namespace
}  // namespace qg
