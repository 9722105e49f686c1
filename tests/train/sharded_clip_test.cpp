// nn::Trainer refuses gradient clipping with sharded optimizer states: each rank's update
// nodes see only its share of the gradients, so the norm would not be the global one. The
// check runs while the step is built, before any collective, so a stand-in communicator of
// two ranks that never communicates is enough.
#include <gtest/gtest.h>

#include "device/communicator.h"
#include "tests/core/test_util.h"
#include "train/trainer.h"

namespace qg {
namespace {

class TwoRanksThatNeverTalk : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "stand-in"; }
  DeviceType memory() const override { return DeviceType::cpu; }
  void all_reduce(void*, int64_t, DType, ReduceOp, void*) override { ADD_FAILURE(); }
  void broadcast(void*, int64_t, int, void*) override { ADD_FAILURE(); }
  void all_gather(const void*, void*, int64_t, void*) override { ADD_FAILURE(); }
  void barrier() override { ADD_FAILURE(); }
  void set_timeout(std::chrono::milliseconds) override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(0); }
};

TEST(TrainerOptimizer, ClippingWithShardedOptimizerStatesIsANamedError) {
  nn::Dataset data;
  data.features = 4;
  for (int i = 0; i < 16; ++i) {
    for (int f = 0; f < 4; ++f) data.x.push_back(0.1f * static_cast<float>(i + f));
    data.labels.push_back(i % 2);
  }
  TwoRanksThatNeverTalk comm;
  nn::TrainConfig c;
  c.mlp = {4, {8}, 2, 4};
  c.comm = &comm;
  c.shard_optimizer_states = true;
  c.optimizer.kind = "adamw";
  c.optimizer.clip_grad_norm = 1.0;
  testing::expect_error([&] { nn::Trainer(c, data, data); },
                        {"[trainer]", "clip_grad_norm 1", "ZeRO stage 1"});
}

}  // namespace
}  // namespace qg
