// Training on the digits data: learning happens, the same seed gives identical metrics,
// and resuming from a checkpoint reproduces the uninterrupted run bit for bit.
#include <gtest/gtest.h>

#include <cstdio>

#include "nn/quantized.h"
#include "runtime/backend.h"
#include "tests/core/test_util.h"
#include "tests/train/train_util.h"

namespace qg {
namespace {

using testing::all_state_bytes;
using testing::DigitsFixture;
using testing::expect_error;

void expect_same_metrics(const std::vector<nn::EpochMetrics>& a,
                         const std::vector<nn::EpochMetrics>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].step, b[i].step);
    // Exact equality on purpose: the CPU run is deterministic (wall time is not compared).
    EXPECT_EQ(a[i].train_loss, b[i].train_loss) << "epoch " << i + 1;
    EXPECT_EQ(a[i].train_accuracy, b[i].train_accuracy);
    EXPECT_EQ(a[i].test_accuracy, b[i].test_accuracy);
  }
}

class TrainerTest : public ::testing::Test, public DigitsFixture {};

TEST_F(TrainerTest, FloatAndQatModelsLearn) {
  for (nn::QConfig qc : {nn::QConfig::float32(), nn::QConfig::w8a8()}) {
    nn::Trainer t(config(qc, 32), train, test);
    double before = t.evaluate(test);
    for (int e = 0; e < 6; ++e) t.train_epoch();
    EXPECT_LT(before, 0.3) << qc.str();
    EXPECT_GT(t.history().back().test_accuracy, 0.85) << qc.str();
    EXPECT_LT(t.history().back().train_loss, t.history().front().train_loss) << qc.str();
    EXPECT_EQ(t.step(), 6 * (train.size() / 64));
  }
}

TEST_F(TrainerTest, SameSeedGivesIdenticalMetricsAndWeights) {
  nn::Trainer a(config(nn::QConfig::w4a8()), train, test);
  nn::Trainer b(config(nn::QConfig::w4a8()), train, test);
  nn::Trainer c(config(nn::QConfig::w4a8(), 16, /*seed=*/4), train, test);
  for (int e = 0; e < 2; ++e) {
    a.train_epoch();
    b.train_epoch();
    c.train_epoch();
  }
  expect_same_metrics(a.history(), b.history());
  EXPECT_EQ(all_state_bytes(a), all_state_bytes(b));
  EXPECT_NE(a.history().back().train_loss, c.history().back().train_loss);
}

TEST_F(TrainerTest, ResumeReproducesTheUninterruptedRunBitForBit) {
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::float32()}) {
    nn::TrainConfig cfg = config(qc);
    cfg.optimizer.kind = qc.quantized() ? "adam" : "sgd";  // both optimizers' state
    nn::Trainer full(cfg, train, test);
    for (int e = 0; e < 4; ++e) full.train_epoch();

    std::string path = ::testing::TempDir() + "/qg_resume.qgck";
    {
      nn::Trainer first(cfg, train, test);
      first.train_epoch();
      first.train_epoch();
      first.save_checkpoint(path);
    }
    nn::Trainer resumed(cfg, train, test);
    resumed.load_checkpoint(path);
    EXPECT_EQ(resumed.epoch(), 2);
    EXPECT_EQ(resumed.step(), 2 * (train.size() / 64));
    resumed.train_epoch();
    resumed.train_epoch();
    expect_same_metrics(full.history(), resumed.history());
    EXPECT_EQ(all_state_bytes(full), all_state_bytes(resumed)) << qc.str();
    std::remove(path.c_str());
  }
}

TEST_F(TrainerTest, CheckpointOfAnotherModelIsRejected) {
  std::string path = ::testing::TempDir() + "/qg_other.qgck";
  nn::Trainer a(config(nn::QConfig::w8a8(), 16), train, test);
  a.save_checkpoint(path);
  nn::Trainer wider(config(nn::QConfig::w8a8(), 32), train, test);
  expect_error([&] { wider.load_checkpoint(path); }, {"checkpoint", "written for", "64,16,10"});
  nn::Trainer fp(config(nn::QConfig::float32(), 16), train, test);
  expect_error([&] { fp.load_checkpoint(path); }, {"checkpoint", "float32"});
  expect_error([&] { fp.load_checkpoint(path + ".missing"); }, {"cannot open"});
  std::remove(path.c_str());
}

TEST_F(TrainerTest, PtqCalibrationSetsObserversFromFloatWeights) {
  nn::Trainer fp(config(nn::QConfig::float32()), train, test);
  fp.train_epoch();
  nn::Trainer q(config(nn::QConfig::w8a8()), train, test);
  q.copy_parameters_from(fp);
  EXPECT_EQ(q.executor().parameter("fc1.weight").to_doubles(),
            fp.executor().parameter("fc1.weight").to_doubles());
  q.calibrate(train, 4);
  // Calibrated int8 weights land close to the float model's accuracy.
  EXPECT_NEAR(q.evaluate(test), fp.evaluate(test), 0.03);
}

}  // namespace
}  // namespace qg

namespace qg {
namespace {

class TrainerCudaTest : public ::testing::Test, public testing::DigitsFixture {};

// The whole QAT step (forward, backward, observers, Adam) on the GPU tracks the CPU run.
// Matmul reductions are ordered differently on the two backends, so the runs agree closely
// rather than bit for bit.
TEST_F(TrainerCudaTest, GpuTrainingTracksTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  nn::TrainConfig c = config(nn::QConfig::w8a8(), 32);
  nn::Trainer cpu(c, train, test);
  c.device = Device::cuda();
  nn::Trainer gpu(c, train, test);
  for (int e = 0; e < 2; ++e) {
    nn::EpochMetrics a = cpu.train_epoch(), b = gpu.train_epoch();
    EXPECT_NEAR(a.train_loss, b.train_loss, 1e-3 * a.train_loss) << "epoch " << e + 1;
    EXPECT_NEAR(a.test_accuracy, b.test_accuracy, 3.0 / test.size()) << "epoch " << e + 1;
  }
  // Checkpoints move between devices: a GPU checkpoint resumes on the CPU.
  std::string path = ::testing::TempDir() + "/qg_gpu.qgck";
  gpu.save_checkpoint(path);
  nn::TrainConfig cc = config(nn::QConfig::w8a8(), 32);
  nn::Trainer resumed(cc, train, test);
  resumed.load_checkpoint(path);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(resumed.evaluate(test), resumed.evaluate(test));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qg
