// Data-parallel tests on one host through 127.0.0.1: the rendezvous store, the launch
// environment, the Gloo collectives, observer sync (every kind and scope, fused and unfused,
// NaN/inf in one rank's shard), N-rank training against 1-rank training on the same global
// batch, and faults (a rank that raises, a rank that is killed). The ranks are dist_worker
// processes started by dist::launch_local; each writes what it saw into a scratch folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/digits.h"
#include "runtime/distributed/launch.h"
#include "runtime/distributed/launch_env.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/tcp_store.h"
#include "runtime/distributed/watchdog.h"
#include "tests/distributed/dist_test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace qg {
namespace {

using namespace std::chrono_literals;
using namespace qg::testing;

// ---------------------------------------------------------------- store and environment
TEST(TcpStore, SetGetAddWaitAcrossClients) {
  dist::TcpStoreServer server(0);
  dist::TcpStoreClient a("127.0.0.1", server.port(), 5s), b("127.0.0.1", server.port(), 5s);
  a.set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.get("k", 1s), std::string("v\0w", 3));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 7);
  std::string v;
  EXPECT_FALSE(b.try_get("missing", v));
  a.set("empty", "");
  EXPECT_EQ(b.get("empty", 1s), "");
}

TEST(TcpStore, MissingKeyTimesOutNamingIt) {
  dist::TcpStoreServer server(0);
  dist::TcpStoreClient a("127.0.0.1", server.port(), 5s);
  try {
    a.wait({"never"}, 100ms);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, NoServerIsAnErrorNamingTheEndpoint) {
  const int port = dist::free_port();
  try {
    dist::TcpStoreClient a("127.0.0.1", port, 200ms);
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, ServerGoneIsAnError) {
  auto server = std::make_unique<dist::TcpStoreServer>(0);
  dist::TcpStoreClient a("127.0.0.1", server->port(), 2s);
  a.set("k", "v");
  server.reset();
  std::string v;
  EXPECT_THROW(a.try_get("k", v), Error);
}

// A connection watched for a rank marks it gone when it closes without a goodbye, and not
// when it says one; rank 0's exit waits for the watched peers.
TEST(TcpStore, WatchedConnectionsMarkTheirRankGoneUnlessTheySayBye) {
  dist::TcpStoreServer server(0);
  dist::TcpStoreClient reader("127.0.0.1", server.port(), 2s);
  std::string v;
  {
    dist::TcpStoreClient one("127.0.0.1", server.port(), 2s), two("127.0.0.1", server.port(), 2s);
    one.watch(1);
    two.watch(2);
    two.bye();
    EXPECT_FALSE(server.wait_for_watchers(0, 50ms));  // both connections still open
  }
  EXPECT_TRUE(server.wait_for_watchers(0, 2s));
  EXPECT_TRUE(reader.try_get("qg/gone/1", v));
  EXPECT_FALSE(reader.try_get("qg/gone/2", v));
}

// The watchdog names the peer that reported a failure, the peer that died, and rank 0's store
// going away, each through its handler.
TEST(Watchdog, NamesTheFailedDeadOrVanishedRank) {
  auto server = std::make_unique<dist::TcpStoreServer>(0);
  const int port = server->port();
  auto expect_message = [&](dist::Watchdog& w, const std::string& needle) {
    std::string m;
    for (int i = 0; i < 200 && m.empty(); ++i) {
      m = w.check_once();
      if (m.empty()) std::this_thread::sleep_for(10ms);
    }
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  };
  std::mutex mu;
  std::string handled;
  dist::Watchdog w0("127.0.0.1", port, 0, 3, 2s, 20ms, [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    handled = m;
  });
  EXPECT_EQ(w0.check_once(), "");
  {
    dist::TcpStoreClient rank2("127.0.0.1", port, 2s);
    rank2.watch(2);
  }  // rank 2 ends without a goodbye
  expect_message(w0, "rank 2 ended without a goodbye");
  auto handled_now = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return handled;
  };
  for (int i = 0; i < 200 && handled_now().empty(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_NE(handled_now().find("rank 0 of 3: rank 2 ended"), std::string::npos) << handled_now();
  dist::Watchdog w1("127.0.0.1", port, 1, 2, 2s, 1h, [](const std::string&) {});
  dist::TcpStoreClient(("127.0.0.1"), port, 2s).set("qg/failed/0", "boom");
  expect_message(w1, "rank 0 reported: boom");
  server.reset();
  expect_message(w1, "stopped answering: rank 0 died");
}

struct EnvGuard {
  std::vector<std::string> names = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
                                    "MASTER_ADDR", "MASTER_PORT", "QG_DIST_TIMEOUT"};
  EnvGuard() { clear(); }
  ~EnvGuard() { clear(); }
  void clear() {
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
};

void expect_env_error(const std::string& needle) {
  try {
    dist::LaunchEnv::from_environment();
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, ReadsTorchrunVariablesAndRejectsBadOnes) {
  EnvGuard guard;
  EXPECT_FALSE(dist::LaunchEnv::from_environment().has_value());
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  auto e = dist::LaunchEnv::from_environment();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->local_rank, 1);  // LOCAL_RANK defaults to RANK
  EXPECT_EQ(e->master_port, 29511);
  ::setenv("RANK", "2", 1);
  expect_env_error("RANK=2 is outside [0, WORLD_SIZE=2)");
  ::setenv("RANK", "x1", 1);
  expect_env_error("RANK='x1' is not an integer");
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  expect_env_error("MASTER_PORT=70000");
  ::unsetenv("MASTER_PORT");
  expect_env_error("needs MASTER_PORT");
  ::setenv("QG_DIST_TIMEOUT", "-1", 1);
  EXPECT_THROW(dist::timeout_from_environment(1s), Error);
  ::setenv("QG_DIST_TIMEOUT", "2.5", 1);
  EXPECT_EQ(dist::timeout_from_environment(1s), 2500ms);
}

TEST(Launch, ReportsTheRankThatFailed) {
  dist::LocalLaunch l;
  l.argv = {"/bin/sh", "-c", "[ \"$RANK\" = 1 ] && exit 7; exit 0"};
  l.nproc = 3;
  dist::LaunchResult r = dist::launch_local(l);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_NE(r.what.find("rank 1"), std::string::npos) << r.what;
}

TEST(Launch, StopsRanksThatOutliveTheGrace) {
  dist::LocalLaunch l;
  l.argv = {"/bin/sh", "-c", "[ \"$RANK\" = 0 ] && exit 1; exec sleep 600"};
  l.nproc = 2;
  l.grace = 100ms;
  dist::LaunchResult r = dist::launch_local(l);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_EQ(r.codes[1], 128 + SIGTERM);
}

// ---------------------------------------------------------------- collectives
TEST(Gloo, CollectivesOnTwoAndThreeRanks) {
  SKIP_WITHOUT_GLOO();
  for (int n : {2, 3}) {
    const std::string dir = scratch("coll" + std::to_string(n));
    dist::LaunchResult r = run_workers(n, {"collectives", dir});
    ASSERT_EQ(r.failed_rank, -1) << r.what << "\n" << read_file(dir + "/err_r0.txt");
    for (int k = 0; k < n; ++k) EXPECT_EQ(read_file(result_file(dir, "collectives", n, k)), "ok\n");
  }
}

// Ranks that exit right after the rendezvous (a run with no collective, such as a resume that
// only loads a checkpoint) must not fail a peer still completing its connections: without
// the barrier that ends the rendezvous, about one 3-rank launch in eight failed with
// "Connection closed by peer", so 20 launches catch it almost always.
TEST(Gloo, RanksLeavingRightAfterTheRendezvousFailNoPeer) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = scratch("connect");
  for (int i = 0; i < 20; ++i) {
    dist::LaunchResult r = run_workers(3, {"connect", dir});
    ASSERT_EQ(r.failed_rank, -1) << "launch " << i << ": " << r.what << "\n"
                                 << read_file(dir + "/err_r" + std::to_string(r.failed_rank) +
                                              ".txt");
  }
}

// ---------------------------------------------------------------- observers
// N ranks observing their shards leave, bit for bit, the qparams and every state of one
// process observing the concatenated batch (min/max, moving average, histogram, percentile;
// per tensor, channel and group; delayed; a NaN and an infinity in rank 1's shard).
void check_observers(const std::string& mode) {
  const std::string dir = scratch("obs_" + mode);
  dist::LaunchResult one = run_workers(1, {"observers", dir, mode});
  ASSERT_EQ(one.failed_rank, -1) << one.what << read_file(dir + "/err_r0.txt");
  const std::string stem = "observers_" + mode;
  const std::vector<std::string> want = lines_of(result_file(dir, stem, 1, 0));
  ASSERT_EQ(want.size(), 48u);  // 12 cases x (the node count, 3 steps)
  int fused = 0;
  for (const std::string& l : want) fused += l.find("fused nodes 1") != std::string::npos;
  EXPECT_EQ(fused, mode == "fused" ? 8 : 0);  // min/max and moving average, 2 scopes, delayed
  for (int n : {2, 3}) {
    dist::LaunchResult r = run_workers(n, {"observers", dir, mode});
    ASSERT_EQ(r.failed_rank, -1) << r.what << read_file(dir + "/err_r0.txt");
    for (int k = 0; k < n; ++k) {
      const std::vector<std::string> got = lines_of(result_file(dir, stem, n, k));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got[i], want[i]) << n << " ranks, rank " << k << ", line " << i;
    }
  }
}

TEST(ObserverSync, UnfusedMatchesOneProcessBitForBit) {
  SKIP_WITHOUT_GLOO();
  check_observers("unfused");
}

TEST(ObserverSync, FusedMatchesOneProcessBitForBit) {
  SKIP_WITHOUT_GLOO();
  check_observers("fused");
}

// The gathered input of the CUDA histogram and percentile observers' sync, on CPU ranks: 2 and
// 3 ranks' shards gather into the one process's rows, byte for byte, with its layout; a scope of
// rows (channel on axis 0) is refused.
TEST(ObserverSync, GatheredInputIsTheGlobalBatch) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = scratch("gather_input");
  dist::LaunchResult one = run_workers(1, {"gather_input", dir});
  ASSERT_EQ(one.failed_rank, -1) << one.what << read_file(dir + "/err_r0.txt");
  const std::vector<std::string> want = lines_of(result_file(dir, "gather_input", 1, 0));
  ASSERT_EQ(want.size(), 2u);
  EXPECT_NE(want[0].find("tensor outer 96 "), std::string::npos) << want[0];
  EXPECT_NE(want[1].find("channel outer 12 axis_len 8 qparams 8 "), std::string::npos) << want[1];
  for (int n : {2, 3}) {
    dist::LaunchResult r = run_workers(n, {"gather_input", dir});
    ASSERT_EQ(r.failed_rank, -1) << r.what << read_file(dir + "/err_r0.txt");
    for (int k = 0; k < n; ++k) {
      std::vector<std::string> got = lines_of(result_file(dir, "gather_input", n, k));
      ASSERT_EQ(got.size(), 3u) << n << " ranks, rank " << k;
      EXPECT_EQ(got[2], "channel axis 0: refused");
      got.pop_back();
      EXPECT_EQ(got, want) << n << " ranks, rank " << k;
    }
  }
}

// ---------------------------------------------------------------- training
// N-rank training against 1-rank training on the same global batch: the state (parameters,
// optimizer moments, observer statistics, qparams) is bit-identical on every rank after every
// step, and the global batch's loss agrees with one process's to 1e-4 relative (the gradient
// sums run in another order; docs/DISTRIBUTED.md).
void check_training(const std::string& model, const std::vector<int>& worlds) {
  const std::string dir = scratch("train_" + model);
  dist::LaunchResult one = run_workers(1, {"train", dir, model});
  ASSERT_EQ(one.failed_rank, -1) << one.what << read_file(dir + "/err_r0.txt");
  const std::string stem = "train_" + model;
  const std::vector<std::string> want = lines_of(result_file(dir, stem, 1, 0));
  ASSERT_EQ(want.size(), 5u);
  for (int n : worlds) {
    dist::LaunchResult r = run_workers(n, {"train", dir, model});
    ASSERT_EQ(r.failed_rank, -1) << r.what << read_file(dir + "/err_r0.txt");
    const std::vector<std::string> rank0 = lines_of(result_file(dir, stem, n, 0));
    ASSERT_EQ(rank0.size(), want.size());
    for (int k = 1; k < n; ++k)
      EXPECT_EQ(lines_of(result_file(dir, stem, n, k)), rank0) << "rank " << k << " of " << n;
    for (size_t i = 0; i < want.size(); ++i) {
      std::istringstream a(want[i]), b(rank0[i]);
      std::string w1, w2, w3, w4;
      double la = 0, lb = 0;
      a >> w1 >> w2 >> w3 >> la;
      b >> w1 >> w2 >> w4 >> lb;
      EXPECT_NEAR(lb, la, 1e-4 * std::fabs(la)) << model << ", " << n << " ranks, step " << i + 1;
    }
  }
}

TEST(DataParallel, MlpTwoAndThreeRanksMatchOneProcess) {
  SKIP_WITHOUT_GLOO();
  check_training("mlp", {2, 3});
}

TEST(DataParallel, CnnWithSyncBatchNormMatchesOneProcess) {
  SKIP_WITHOUT_GLOO();
  check_training("cnn", {2});
}

TEST(DataParallel, TransformerMatchesOneProcess) {
  SKIP_WITHOUT_GLOO();
  check_training("transformer", {2});
}

// Post-training calibration: 2 ranks, each observing its share of 4 global batches, leave
// every state as one process observing the same rows does, bit for bit.
TEST(DataParallel, CalibrationMatchesOneProcess) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = scratch("calibrate");
  ASSERT_EQ(run_workers(1, {"calibrate", dir}).failed_rank, -1) << read_file(dir + "/err_r0.txt");
  ASSERT_EQ(run_workers(2, {"calibrate", dir}).failed_rank, -1) << read_file(dir + "/err_r0.txt");
  const std::string want = read_file(result_file(dir, "calibrate", 1, 0));
  ASSERT_FALSE(want.empty());
  for (int k = 0; k < 2; ++k) EXPECT_EQ(read_file(result_file(dir, "calibrate", 2, k)), want);
}

// ZeRO-1: 2 and 3 sharded ranks train bit for bit as 2 unsharded ranks (the same averaged
// gradients reach the same update, whichever rank applies it), each holding a share of the
// optimizer state; rank 0's checkpoint holds the unsharded run's states byte for byte, and resumes
// into one process and into 3 sharded ranks.
TEST(DataParallel, ShardedOptimizerStateTrainsAsUnsharded) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = scratch("zero1");
  ASSERT_EQ(run_workers(2, {"zero1", dir, "off"}).failed_rank, -1)
      << read_file(dir + "/err_r0.txt");
  const std::vector<std::string> plain = lines_of(result_file(dir, "zero1_off", 2, 0));
  ASSERT_EQ(plain.size(), 7u);  // 5 steps, the state bytes, the final digest
  const int64_t full = std::stoll(plain[5].substr(plain[5].find(' ') + 1));
  for (int n : {3, 2}) {  // 2 last: its checkpoint is the one the resumes below load
    ASSERT_EQ(run_workers(n, {"zero1", dir, "on"}).failed_rank, -1)
        << read_file(dir + "/err_r0.txt") << read_file(dir + "/err_r1.txt");
    int64_t held = 0;
    for (int k = 0; k < n; ++k) {
      const std::vector<std::string> mine = lines_of(result_file(dir, "zero1_on", n, k));
      ASSERT_EQ(mine.size(), plain.size());
      // Two ranks: each step's loss (on this rank's shard) and state as unsharded. Three ranks
      // sum the gradients in another order: their states agree among themselves.
      const std::vector<std::string> ref = n == 2 ? lines_of(result_file(dir, "zero1_off", 2, k))
                                                  : lines_of(result_file(dir, "zero1_on", 3, 0));
      for (size_t i = 0; i < 5; ++i) {
        if (n == 2) {
          EXPECT_EQ(mine[i], ref[i]) << "rank " << k << " of " << n;
        }
        EXPECT_EQ(mine[i].substr(mine[i].find("state")), ref[i].substr(ref[i].find("state")))
            << "rank " << k << " of " << n;
      }
      const int64_t bytes = std::stoll(mine[5].substr(mine[5].find(' ') + 1));
      EXPECT_LT(bytes, full) << "rank " << k << " of " << n;
      held += bytes;
    }
    EXPECT_EQ(held, full) << n << " ranks";
  }
  // Section for section (the history differs in its wall times only).
  const std::vector<nn::CheckpointSection> a = nn::read_checkpoint(dir + "/zero1_on.qgck"),
                                           b = nn::read_checkpoint(dir + "/zero1_off.qgck");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    if (a[i].name != "history") {
      EXPECT_TRUE(a[i].payload == b[i].payload) << a[i].name;
    }
  }
  ASSERT_EQ(run_workers(1, {"zero1_resume", dir, "off"}).failed_rank, -1)
      << read_file(dir + "/err_r0.txt");
  EXPECT_EQ(lines_of(result_file(dir, "zero1_resume_off", 1, 0))[0], plain[6]);
  ASSERT_EQ(run_workers(3, {"zero1_resume", dir, "on"}).failed_rank, -1)
      << read_file(dir + "/err_r0.txt");
  const std::string params = lines_of(result_file(dir, "zero1_on", 2, 0))[6];
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(lines_of(result_file(dir, "zero1_resume_on", 3, k))[0], params) << "rank " << k;
}

// ---------------------------------------------------------------- faults
// The watchdog (what NCCL ranks run): rank 1 is killed while rank 0 waits where no timeout
// reaches (a sleep stands for a GPU collective that never ends). Rank 0's watchdog ends it
// within seconds, naming rank 1; no store timeout is involved (it is 60 s here).
TEST(Faults, WatchdogEndsTheRanksOfADeadPeer) {
  const std::string dir = scratch("watchdog");
  const auto t0 = std::chrono::steady_clock::now();
  dist::LaunchResult r = run_workers(2, {"watchdog", dir}, 60s, {{"QG_DIST_TIMEOUT", "60"}});
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.codes.size(), 2u);
  EXPECT_EQ(r.codes[0], 3) << r.what;
  EXPECT_EQ(r.codes[1], 128 + SIGKILL) << r.what;
  EXPECT_LT(seconds, 20.0);
  const std::string err0 = read_file(dir + "/err_r0.txt");
  EXPECT_NE(err0.find("rank 0 of 2: rank 1 ended without a goodbye"), std::string::npos) << err0;
}

// Rank 1 fails in the second epoch. Every rank exits non-zero on its own (not stopped by the
// launcher) with an error, and the checkpoint of the first epoch, written by rank 0, loads
// (into one process with the same global batch: another rank count).
void check_fault(const std::string& mode, int victim_code, const std::string& timeout = "30") {
  SKIP_WITHOUT_GLOO();
  const std::string dir = scratch("fault_" + mode);
  dist::LaunchResult r = run_workers(2, {"fault", dir, mode}, 60s, {{"QG_DIST_TIMEOUT", timeout}});
  ASSERT_EQ(r.codes.size(), 2u);
  EXPECT_EQ(r.codes[1], victim_code) << r.what;
  EXPECT_EQ(r.codes[0], 3) << "rank 0 did not fail on its own: " << r.what;
  const std::string err0 = read_file(dir + "/err_r0.txt");
  EXPECT_NE(err0.find("rank 0 of 2"), std::string::npos) << err0;
  if (mode == "badbatch") {
    EXPECT_NE(err0.find("rank 1 reported"), std::string::npos) << err0;
    EXPECT_NE(read_file(dir + "/err_r1.txt").find("label"), std::string::npos);
  }
  nn::Dataset all = nn::load_digits(), data, test;
  data.features = test.features = all.features;
  data.x.assign(all.x.begin(), all.x.begin() + 192 * all.features);
  data.labels.assign(all.labels.begin(), all.labels.begin() + 192);
  test = data;
  nn::TrainConfig c;
  c.model = "mlp";
  c.mlp.hidden = {16};
  c.mlp.batch = 32;
  c.qconfig = nn::QConfig::w8a8();
  c.seed = 5;
  nn::Trainer t(c, data, test);
  t.load_checkpoint(dir + "/checkpoint.qgck");
  EXPECT_EQ(t.epoch(), 1);
  EXPECT_EQ(t.step(), 6);
}

TEST(Faults, RankWithBadBatchFailsEveryRank) {
  check_fault("badbatch", 3);
}

TEST(Faults, KilledRankFailsEveryRank) {
  check_fault("kill", 128 + SIGKILL);
}

// Rank 1 stalls for 2.5 s with a 1 s timeout: rank 0's collective times out and it fails; rank
// 1 fails at its next collective, its peer gone.
TEST(Faults, StuckRankTimesOutEveryRank) {
  check_fault("stall", 3, "1");
}

}  // namespace
}  // namespace qg
