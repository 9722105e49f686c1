// Activation recomputation per decoder block (LmTrainConfig::recompute, autograd/recompute.h):
// a tiny Llama trains bit for bit as without it, under every precision and recipe the Llama
// recipes use, while the memory plan's peak drops by at least the activations of the blocks
// whose internals no longer live through the backward.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "data/text_corpus.h"
#include "data/tokenizer.h"
#include "runtime/memory_plan.h"
#include "tests/common/lm_cli_test.h"
#include "tests/core/test_util.h"
#include "tests/train/tiny_lm_config.h"
#include "train/checkpoint.h"
#include "train/lm_trainer.h"

namespace qg {
namespace {

const std::string& kFixture = testing::kTinyLlamaFixture;

// The committed tiny config, narrowed to 2 blocks of hidden 32 so a run takes milliseconds.
nn::LmTrainConfig two_blocks() {
  nn::LmTrainConfig c = testing::tiny_lm_config(32, 64, 2);
  c.optimizer.kind = "adamw";
  c.optimizer.clip_grad_norm = 1.0;
  c.seed = 7;
  return c;
}

std::vector<int32_t> pattern(size_t n, int32_t vocab) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>((i * 7 + i / 3) % vocab);
  return s;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

struct Recipe {
  const char* name;
  nn::QConfig qconfig;
  nn::PrecisionPolicy precision;
};

// Losses, gradient norms, the validation loss and every persistent state (weights, AdamW
// moments, observer statistics) after 4 steps: the first runs through the executor, the
// others through the static run over the memory plan.
nn::QConfig integer_forward(nn::QConfig qc) {
  qc.integer_forward = true;
  return qc;
}

TEST(Recompute, TrainsBitForBitAsWithoutIt) {
  const std::vector<Recipe> recipes = {
      {"float", nn::QConfig::float32(), nn::PrecisionPolicy::f32()},
      {"8da4w", nn::QConfig::int8_dyn_act_int4_weight(16), nn::PrecisionPolicy::f32()},
      {"bf16-mixed", nn::QConfig::float32(), nn::PrecisionPolicy::bf16_mixed()},
      {"8da4w bf16-mixed", nn::QConfig::int8_dyn_act_int4_weight(16),
       nn::PrecisionPolicy::bf16_mixed()},
      // Static observers inside every block: kept, never run twice.
      {"w8a8", nn::QConfig::w8a8(), nn::PrecisionPolicy::f32()},
      // The integer forward: its codes (quantize nodes) are recomputed with the block.
      {"8da4w integer forward bf16-mixed",
       integer_forward(nn::QConfig::int8_dyn_act_int4_weight(16)),
       nn::PrecisionPolicy::bf16_mixed()},
      {"w8a8 dynamic integer forward", integer_forward(nn::QConfig::int8_dyn_act_int8_weight()),
       nn::PrecisionPolicy::f32()},
  };
  const std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  for (const Recipe& r : recipes) {
    SCOPED_TRACE(r.name);
    nn::LmTrainConfig c = two_blocks();
    c.qconfig = r.qconfig;
    c.precision = r.precision;
    nn::LmTrainer plain(c, train, valid);
    c.recompute = true;
    nn::LmTrainer recomputed(c, train, valid);
    for (int step = 0; step < 4; ++step) {
      const double a = plain.train_step(), b = recomputed.train_step();
      EXPECT_EQ(a, b) << "step " << step;
      EXPECT_EQ(plain.last_grad_norm(), recomputed.last_grad_norm()) << "step " << step;
    }
    EXPECT_EQ(plain.evaluate(), recomputed.evaluate());
    std::map<std::string, Tensor*> want = state_index(plain.executor());
    std::map<std::string, Tensor*> got = state_index(recomputed.executor());
    ASSERT_EQ(want.size(), got.size());
    for (const auto& [key, t] : want) {
      ASSERT_TRUE(got.count(key)) << key;
      EXPECT_TRUE(same_bytes(*t, *got.at(key))) << key;
    }
  }
}

// Every block's internals are copied for its backward; the w8a8 observers are kept instead
// (two static activation quantizers and one weight observer per projection in each block).
TEST(Recompute, CopiesEachBlockAndKeepsItsObservers) {
  const std::vector<int32_t> train = pattern(400, 32), valid = pattern(64, 32);
  nn::LmTrainConfig c = two_blocks();
  c.recompute = true;
  {
    nn::LmTrainer t(c, train, valid);
    ASSERT_EQ(t.recompute_stats().regions, 2);
    EXPECT_GT(t.recompute_stats().copied_nodes, 2 * 10);
    EXPECT_EQ(t.recompute_stats().kept_stateful, 0);
  }
  c.qconfig = nn::QConfig::w8a8();
  nn::LmTrainer t(c, train, valid);
  EXPECT_EQ(t.recompute_stats().regions, 2);
  EXPECT_GT(t.recompute_stats().kept_stateful, 0);
}

// A model of 4 blocks: without recomputation, at the start of the backward every block's
// internals are alive; with it, one block's at a time, but the blocks' weight gradients (alive
// until the optimizer) accumulate over the backward. One block's internals include at least
// its MLP's gate and up projections and their SwiGLU product ([rows, intermediate] each, f32)
// and its attention's q, k, v and output ([rows, hidden] each; k and v have fewer heads but
// are as wide here as the bound needs them): the peak must drop by at least three blocks' worth
// of those, less every weight gradient of the blocks.
TEST(Recompute, PlannedPeakDropsByTheBlocksActivations) {
  nn::LmTrainConfig c = two_blocks();
  c.model.num_hidden_layers = 4;
  c.model.hidden_size = 64;
  c.model.intermediate_size = 176;
  c.batch = 8;
  c.seq = 64;
  const std::vector<int32_t> train = pattern(4000, 32), valid = pattern(1024, 32);
  nn::LmTrainer plain(c, train, valid);
  c.recompute = true;
  nn::LmTrainer recomputed(c, train, valid);
  const int64_t without = plain.planned_step_bytes(), with = recomputed.planned_step_bytes();
  const int64_t rows = c.batch * c.seq, f32 = 4, d = c.model.hidden_size;
  const int64_t inter = c.model.intermediate_size;
  const int64_t kv = d / c.model.num_attention_heads * c.model.num_key_value_heads;
  const int64_t activations = (3 * rows * inter + 2 * rows * d + 2 * rows * kv) * f32;
  const int64_t weight_grads = (2 * d * d + 2 * kv * d + 3 * inter * d) * f32;
  const int64_t layers = c.model.num_hidden_layers;
  std::printf("planned step peak, %lld blocks: %s without recomputation, %s with (%.2fx)\n",
              static_cast<long long>(layers), format_bytes(without).c_str(),
              format_bytes(with).c_str(), static_cast<double>(without) / static_cast<double>(with));
  EXPECT_LE(with, without - ((layers - 1) * activations - layers * weight_grads));
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The bytes of the "step memory: <n> <unit>" line `qat train --model llama` prints.
double step_memory_bytes(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("step memory: ([0-9.]+) (B|KiB|MiB)"))) return -1;
  const double scale = m[2] == "B" ? 1.0 : m[2] == "KiB" ? 1024.0 : 1024.0 * 1024.0;
  return std::stod(m[1]) * scale;
}

// The history section of a checkpoint without its wall times: "step train_loss
// validation_loss" per line.
std::string history_without_times(const std::string& payload) {
  std::istringstream is(payload);
  std::string line, out;
  while (std::getline(is, line)) out += line.substr(0, line.rfind(' ')) + "\n";
  return out;
}

// `qat train --model llama --recompute` on the Python tutorial: the checkpoint it writes (every
// weight, AdamW moment, the crop sampler, the losses) equals the run's without it byte for
// byte, wall times aside, and the step memory it reports is lower. At 8 x 64 tokens the
// activations outweigh the weight gradients; at a few tokens per step the peak is the end of
// the backward, where every weight gradient is alive whether or not blocks are recomputed.
TEST(Recompute, QatTrainLlamaRecomputeWritesTheSameCheckpoint) {
  namespace fs = std::filesystem;
  QG_REQUIRE_LM_CLI(corpus, qat);
  const fs::path dir = fs::temp_directory_path() / "qg_lm_recompute";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string logs[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    const fs::path out = dir / (recompute ? "recompute" : "plain");
    const std::string cmd =
        std::string(qat) + " train --model llama --config " + kFixture + " --data " +
        (dir / "data").string() + " --corpus " + corpus + " --out " + out.string() +
        " --device cpu --steps 3 --eval-every 3 --batch 8 --seq 64"
        " --eval-windows 8 --optimizer adamw --clip-grad-norm 1" +
        (recompute ? " --recompute" : "") + " > " + (dir / "log.txt").string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    logs[recompute] = read_all(dir / "log.txt");
    ASSERT_EQ(rc, 0) << logs[recompute];
  }
  EXPECT_NE(logs[1].find("recomputing each decoder block's activations"), std::string::npos)
      << logs[1];
  const double plain = step_memory_bytes(logs[0]), recomputed = step_memory_bytes(logs[1]);
  std::printf(
      "qat train --model llama (tiny fixture): step memory %.0f B, %.0f B with --recompute\n",
      plain, recomputed);
  ASSERT_GT(recomputed, 0) << logs[1];
  EXPECT_LT(recomputed, plain);
  const std::vector<nn::CheckpointSection> a =
      nn::read_checkpoint((dir / "plain" / "checkpoint.qgck").string());
  const std::vector<nn::CheckpointSection> b =
      nn::read_checkpoint((dir / "recompute" / "checkpoint.qgck").string());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_GT(a.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    if (a[i].name == "history")
      EXPECT_EQ(history_without_times(a[i].payload), history_without_times(b[i].payload));
    else
      EXPECT_TRUE(a[i].payload == b[i].payload) << a[i].name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qg
