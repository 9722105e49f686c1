// The data-parallel tests on two GPUs through NCCL: the collectives, observer sync, QAT
// training against one GPU, a killed rank, and ZeRO-1. Run where QG_TEST_GPUS >= 2
// (scripts/gpu_dist_check.sh and scripts/gpu_session.sh set it on the 2-GPU machine); skipped
// elsewhere. The ranks are dist_worker processes (tests/distributed/dist_worker.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include "runtime/distributed/launch.h"
#include "runtime/distributed/process_group.h"
#include "tests/distributed/dist_test_util.h"
#include "train/checkpoint.h"

namespace qg {
namespace {

using namespace std::chrono_literals;
using namespace qg::testing;

// Whether this run has two GPUs to test on: NCCL built in and QG_TEST_GPUS >= 2.
bool two_gpus() {
  const char* n = std::getenv("QG_TEST_GPUS");
  return dist::built_with_nccl() && n != nullptr && std::atoi(n) >= 2;
}

TEST(Nccl, CollectivesOnTwoGpus) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  const std::string dir = scratch("nccl_coll");
  dist::LaunchResult r = run_workers(2, {"collectives_cuda", dir});
  ASSERT_EQ(r.failed_rank, -1) << r.what << read_file(dir + "/err_r0.txt");
  for (int k = 0; k < 2; ++k)
    EXPECT_EQ(read_file(result_file(dir, "collectives_cuda", 2, k)), "ok\n");
}

// The CUDA observers synced between two GPUs (min/max and moving average through their
// ranges; histogram and percentile through the gathered input) leave, bit for bit, the
// states and fake-quantized output of one GPU observing the concatenated batch: unfused and
// fused (the per-tensor kernels exchanging ranges inside their single pass), through the
// peer mailbox (the default on one host) and through NCCL (QG_PEER_MAILBOX=0).
TEST(Nccl, ObserversOnTwoGpusMatchOne) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  for (const std::string mode : {"unfused", "fused"}) {
    const std::string dir = scratch("nccl_obs_" + mode);
    const std::string stem = "observers_cuda_" + mode;
    dist::LaunchResult one = run_workers(1, {"observers_cuda", dir, mode});
    ASSERT_EQ(one.failed_rank, -1) << one.what << read_file(dir + "/err_r0.txt");
    const auto want = lines_of(result_file(dir, stem, 1, 0));
    ASSERT_EQ(want.size(), 48u);  // 12 cases x (the node count, 3 steps)
    for (const std::string mailbox : {"1", "0"}) {
      dist::LaunchResult two =
          run_workers(2, {"observers_cuda", dir, mode}, std::chrono::seconds(60),
                      {{"QG_PEER_MAILBOX", mailbox}});
      ASSERT_EQ(two.failed_rank, -1) << two.what << read_file(dir + "/err_r0.txt");
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(lines_of(result_file(dir, stem, 2, k)), want) << mode << " mailbox " << mailbox;
        const std::string path = read_file(dir + "/mailbox_r" + std::to_string(k) + ".txt");
        EXPECT_EQ(path.rfind(mailbox == "1" ? "peer mailbox" : "NCCL all-gather", 0), 0u) << path;
      }
    }
  }
}

// W8A8 QAT: the gradients, the observer statistics and (CNN) the batch-norm statistics go
// through NCCL, so two GPUs match one on the global batch.
TEST(Nccl, QatTrainingOnTwoGpusMatchesOne) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  for (const std::string model : {"mlp", "transformer", "cnn"}) {
    const std::string dir = scratch("nccl_train_" + model);
    dist::LaunchResult one = run_workers(1, {"train_cuda", dir, model});
    ASSERT_EQ(one.failed_rank, -1) << one.what << read_file(dir + "/err_r0.txt");
    dist::LaunchResult two = run_workers(2, {"train_cuda", dir, model});
    ASSERT_EQ(two.failed_rank, -1) << two.what << read_file(dir + "/err_r0.txt");
    const std::string stem = "train_cuda_" + model;
    const auto want = lines_of(result_file(dir, stem, 1, 0));
    const auto r0 = lines_of(result_file(dir, stem, 2, 0)),
               r1 = lines_of(result_file(dir, stem, 2, 1));
    ASSERT_EQ(want.size(), 5u);
    ASSERT_EQ(r0.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // Identical state on both GPUs (the digest ends each line); losses of the shards
      // average to the one-GPU loss.
      EXPECT_EQ(r0[i].substr(r0[i].find("state")), r1[i].substr(r1[i].find("state")));
      std::istringstream a(want[i]), b(r0[i]), c(r1[i]);
      std::string w;
      double la = 0, lb = 0, lc = 0;
      a >> w >> w >> w >> la;
      b >> w >> w >> w >> lb;
      c >> w >> w >> w >> lc;
      EXPECT_NEAR((lb + lc) / 2, la, 1e-4 * std::fabs(la)) << model << " step " << i + 1;
    }
  }
}

// A GPU rank killed mid-training: its peer, waiting in NCCL on the GPU where no timeout
// reaches, is ended by its watchdog within seconds (the store timeout is 60 s).
TEST(Nccl, KilledRankEndsItsPeer) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  const std::string dir = scratch("nccl_kill");
  const auto t0 = std::chrono::steady_clock::now();
  dist::LaunchResult r =
      run_workers(2, {"train_cuda", dir, "mlp_kill"}, 60s, {{"QG_DIST_TIMEOUT", "60"}});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.codes.size(), 2u);
  EXPECT_EQ(r.codes[1], 128 + SIGKILL) << r.what;
  EXPECT_EQ(r.codes[0], 3) << r.what;
  EXPECT_LT(seconds, 30.0) << r.what;
}

// A GPU rank stuck past the timeout between two steps: its peer's observer kernels, waiting in
// the peer mailbox for its statistics, stop at the timeout (nothing spins on forever), and the
// peer fails with an error naming the rank that never published; the watchdog then ends the
// stuck rank.
TEST(Nccl, StuckRankTimesOutItsPeersObserverExchange) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  const std::string dir = scratch("nccl_stall");
  const auto t0 = std::chrono::steady_clock::now();
  dist::LaunchResult r =
      run_workers(2, {"train_cuda", dir, "mlp_stall"}, 60s, {{"QG_DIST_TIMEOUT", "3"}});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.codes.size(), 2u);
  EXPECT_NE(r.codes[0], 0) << r.what;
  EXPECT_NE(r.codes[1], 0) << r.what;
  const std::string err = read_file(dir + "/err_r0.txt");
  EXPECT_NE(err.find("no statistics from rank 1"), std::string::npos) << err;
  EXPECT_LT(seconds, 40.0) << r.what;
}

// ZeRO-1 on two GPUs: the sharded run's states equal the unsharded run's after every step,
// each GPU holds a share of the Adam state, and the checkpoints hold the same states.
TEST(Nccl, ShardedOptimizerStateOnTwoGpusTrainsAsUnsharded) {
  if (!two_gpus()) GTEST_SKIP() << "needs NCCL and QG_TEST_GPUS >= 2";
  const std::string dir = scratch("nccl_zero1");
  for (const char* arg : {"off", "on"}) {
    dist::LaunchResult r = run_workers(2, {"zero1_cuda", dir, arg});
    ASSERT_EQ(r.failed_rank, -1) << r.what << read_file(dir + "/err_r0.txt");
  }
  int64_t full = 0, held = 0;
  for (int k = 0; k < 2; ++k) {
    const auto off = lines_of(result_file(dir, "zero1_cuda_off", 2, k));
    const auto on = lines_of(result_file(dir, "zero1_cuda_on", 2, k));
    ASSERT_EQ(off.size(), 7u);
    ASSERT_EQ(on.size(), off.size());
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(on[i], off[i]) << "rank " << k;
    full = std::stoll(off[5].substr(off[5].find(' ') + 1));
    const int64_t mine = std::stoll(on[5].substr(on[5].find(' ') + 1));
    EXPECT_LT(mine, full);
    held += mine;
  }
  EXPECT_EQ(held, full);
  const auto a = nn::read_checkpoint(dir + "/zero1_on.qgck"),
             b = nn::read_checkpoint(dir + "/zero1_off.qgck");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != "history") {
      EXPECT_TRUE(a[i].payload == b[i].payload) << a[i].name;
    }
}

}  // namespace
}  // namespace qg
