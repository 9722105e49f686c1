#include "tests/distributed/lm_scenarios.h"

#include <cstdio>
#include <vector>

#include "core/error.h"
#include "nn/llama_config.h"
#include "tests/distributed/worker_util.h"
#include "train/lm_trainer.h"

namespace qg::testing {
namespace {

constexpr int64_t kGlobalBatch = 6;  // crops per step: 6 x 1, 3 x 2 or 2 x 3 ranks

// The committed tiny config, narrowed so that a step takes milliseconds: hidden 32 (one
// 8da4w group of 32 per row), 1 layer, 4 heads (2 KV heads), vocab 32.
nn::LmTrainConfig tiny(Communicator* comm, const std::string& recipe) {
  nn::LmTrainConfig c;
  c.model =
      nn::load_llama_config(std::string(QG_TRAIN_TEST_DIR) + "/fixtures/llama_tiny_config.json");
  c.model.vocab_size = 32;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 64;
  c.model.num_hidden_layers = 1;
  if (recipe == "w8a8")
    c.qconfig = nn::QConfig::w8a8();
  else if (recipe == "float_bf16_reduce")
    c.grad_reduce_dtype = DType::bf16;  // float, gradients all-reduced in bf16
  else if (recipe != "float")
    c.qconfig = nn::parse_recipe(recipe, 32);
  c.comm = comm;
  c.batch = kGlobalBatch / (comm ? comm->world_size() : 1);
  c.seq = 8;
  c.lr = {3e-3, 2, 8, 0.1, 4};  // the rate changes level (a recompile) within the run
  c.seed = 5;
  return c;
}

// A stream with structure to learn: period 7 over 32 ids, with a drift so crops differ.
std::vector<int32_t> stream(size_t n) {
  std::vector<int32_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<int32_t>(((i % 7) * 5 + (i / 97) % 3) % 32);
  return s;
}

std::string g9(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

bool run_lm_scenario(const std::string& scenario, Communicator* comm, const std::string& dir,
                     const std::string& arg, std::ostream& out) {
  if (scenario != "lm_train" && scenario != "lm_checkpoint") return false;
  // 16 validation windows of 8: 2 global batches of 6 (the last 4 windows are not scored).
  const std::vector<int32_t> train = stream(600), valid = stream(128);
  if (scenario == "lm_train") {
    nn::LmTrainer t(tiny(comm, arg), train, valid);
    for (int k = 1; k <= 5; ++k) {
      const double loss = t.train_step();
      out << "step " << k << " loss " << g9(loss) << " state " << state_digest(t.executor())
          << '\n';
    }
    out << "validation " << g9(t.evaluate()) << " windows " << t.windows_per_evaluation() << '\n';
    return true;
  }
  const std::string path = dir + "/lm.qgck";
  nn::LmTrainer t(tiny(comm, "8da4w"), train, valid);
  if (arg == "save") {
    for (int k = 0; k < 3; ++k) t.train_step();
    t.save_checkpoint(path);
  } else {
    QG_CHECK(arg == "resume", "dist_worker", "lm_checkpoint ", arg);
    t.load_checkpoint(path);
    out << "resumed at step " << t.step() << '\n';
  }
  for (int k = 4; k <= 5; ++k) out << "step " << k << " loss " << g9(t.train_step()) << '\n';
  return true;
}

}  // namespace qg::testing
