// In-process pieces of data parallelism: the gradient-sync stage's buckets, the collective
// ops' checks, and the trainer's refusals. (The multi-process tests are in
// distributed_test.cpp.)
#include <gtest/gtest.h>

#include "core/graph.h"
#include "device/communicator.h"
#include "runtime/compile.h"
#include "runtime/distributed/gradient_sync.h"
#include "runtime/distributed/optimizer_sharding.h"
#include "runtime/memory_plan.h"
#include "tests/core/test_util.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace qg {
namespace {

using testing::expect_error;

// A linear model with three parameters of 12, 4 and 8 floats (48, 16 and 32 bytes).
struct Model {
  Graph g;
  ValueId x, labels, loss;
  std::vector<ValueId> params;
  Model() {
    x = g.input("x", {DType::f32, {5, 3}});
    labels = g.input("labels", {DType::i64, {5}});
    std::vector<double> w(12), v(8);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1 * static_cast<double>(i) - 0.5;
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05 * static_cast<double>(i);
    ValueId w1 = g.parameter("w1", Tensor::from_doubles({3, 4}, w, DType::f32));
    ValueId b1 = g.parameter("b1", Tensor::from_doubles({4}, {0.1, -0.2, 0.3, 0.0}, DType::f32));
    ValueId w2 = g.parameter("w2", Tensor::from_doubles({4, 2}, v, DType::f32));
    ValueId h = g.apply1("add", {g.apply1("matmul", {x, w1}), b1});
    loss = g.apply1("softmax_cross_entropy", {g.apply1("matmul", {h, w2}), labels});
    params = {w1, b1, w2};
  }
};

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (!g.node(id).dead && g.node(id).op->name == op) ++n;
  return n;
}

Executor::Feeds feeds() {
  std::vector<double> x(15);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.3 * static_cast<double>(i % 7) - 0.8;
  return {{"x", Tensor::from_doubles({5, 3}, x, DType::f32)},
          {"labels", Tensor::from_vector<int64_t>({5}, {0, 1, 1, 0, 1})}};
}

// In one process the sync is the identity: the same parameters, bit for bit, after steps.
TEST(GradientSync, OneProcessIsTheIdentityAndBucketsFollowTheCap) {
  for (int64_t cap : {int64_t{1} << 20, int64_t{48}, int64_t{16}}) {
    Model plain, synced;
    TrainingSpec a{plain.loss, plain.params, nn::optimizer_nodes({"adam", 1e-2}), {}};
    TrainingSpec b{synced.loss, synced.params, nn::optimizer_nodes({"adam", 1e-2}),
                   dist::bucketed_all_reduce(cap)};
    CompileOptions options;
    options.passes.disabled = {"all"};
    CompiledStep sa(plain.g, a, options), sb(synced.g, b, options);
    // 96 bytes of gradients: one bucket under 1 MiB; 48-byte buckets hold w2 + b1 (reverse
    // order) then w1; 16 bytes: each gradient alone.
    EXPECT_EQ(count_ops(synced.g, "bucket_all_reduce"), cap > 96 ? 1 : cap == 48 ? 2 : 3) << cap;
    EXPECT_EQ(count_ops(synced.g, "bucket_get"), 3);
    // Each gradient is read by its bucket only, so the step's memory plan writes it in its
    // bucket (gradient_as_bucket_view): three buffers inside buckets, none copied.
    const MemoryPlan plan =
        plan_memory(synced.g, needed_order(synced.g, {synced.loss}, sb.updates()), {synced.loss});
    int inside = 0;
    for (const PlannedBuffer& pb : plan.buffers) inside += pb.inside >= 0 ? 1 : 0;
    EXPECT_EQ(inside, 3) << cap;
    for (int step = 0; step < 3; ++step) {
      sa.train(feeds(), {});
      sb.train(feeds(), {});
    }
    for (const char* p : {"w1", "b1", "w2"}) {
      const Tensor& ta = sa.executor().parameter(p);
      const Tensor& tb = sb.executor().parameter(p);
      ASSERT_EQ(ta.nbytes(), tb.nbytes());
      EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()), 0) << p << " cap " << cap;
    }
  }
}

// Gradients reduced in bf16: each is cast to bf16 as its bucket is packed and back to f32 as the
// optimizer reads it, so in one process (the all-reduce is the identity) the synced gradient
// is the bf16 rounding of the f32 one; the bucket cap counts bf16 bytes.
TEST(GradientSync, Bf16ReduceRoundsEachGradientAndHalvesTheBuckets) {
  Graph g;
  const std::vector<double> a = {1.0 + 1.0 / 512, -3.0, 0.1}, b = {1.0 + 3.0 / 512, 2.5e-3};
  std::vector<ValueId> grads = {g.input("a", {DType::f32, {3}}), g.input("b", {DType::f32, {2}})};
  std::vector<ValueId> out = dist::bucketed_all_reduce(10, DType::bf16)(g, grads);
  EXPECT_EQ(count_ops(g, "bucket_all_reduce"), 1);  // 5 bf16 values: 10 bytes (20 in f32: two)
  EXPECT_EQ(count_ops(g, "cast"), 4);
  Executor ex(g, Device::cpu());
  std::vector<Tensor> got = ex.run({{"a", Tensor::from_doubles({3}, a, DType::f32)},
                                    {"b", Tensor::from_doubles({2}, b, DType::f32)}},
                                   out);
  ASSERT_EQ(got[0].dtype(), DType::f32);
  // bf16 keeps 8 significant bits: 1 + 1/512 -> 1 (below the midpoint 1 + 1/256),
  // 1 + 3/512 -> 1 + 1/128, 0.1 -> 0.10009765625, 2.5e-3 -> 0.0025024414.
  EXPECT_EQ(got[0].at(0), 1.0);
  EXPECT_EQ(got[0].at(1), -3.0);
  EXPECT_EQ(got[0].at(2), 0.10009765625);
  EXPECT_EQ(got[1].at(0), 1.0 + 1.0 / 128);
  EXPECT_EQ(got[1].at(1), 0.00250244140625);
  Graph f32;
  std::vector<ValueId> same = {f32.input("a", {DType::f32, {3}}),
                               f32.input("b", {DType::f32, {2}})};
  dist::bucketed_all_reduce(10)(f32, same);
  EXPECT_EQ(count_ops(f32, "bucket_all_reduce"), 2);
  EXPECT_EQ(count_ops(f32, "cast"), 0);
  expect_error([] { dist::bucketed_all_reduce(10, DType::i32); },
               {"gradient_sync", "reduce dtype i32", "f32, f64, bf16 or f16"});
}

// ZeRO-1's plan, hand-checked: largest first onto the least-loaded rank, every rank owning
// one parameter at least, offsets in parameter order within a shard.
TEST(OptimizerSharding, PlanBalancesWholeParameters) {
  dist::ShardPlan p = dist::plan_optimizer_shards({12, 4, 8, 4}, 2);
  // 12 -> rank 0; 8 -> rank 1 (owns nothing yet); the first 4 -> rank 1 (load 8 < 12); the
  // second 4 -> rank 0 (loads 12 and 12: the lower rank).
  EXPECT_EQ(p.owner, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 0, 4, 12}));
  EXPECT_EQ(p.shard_elements, 16);
  dist::ShardPlan q = dist::plan_optimizer_shards({100, 1, 1}, 3);
  EXPECT_EQ(q.owner, (std::vector<int>{0, 1, 2}));  // the empty ranks take the small ones
  EXPECT_EQ(q.shard_elements, 100);
  expect_error(
      [] {
        dist::plan_optimizer_shards({5, 5}, 3);
      },
      {"zero1", "2 parameters", "3 ranks"});
}

// In one process the sharded optimizer is the whole optimizer plus an all-gather that is a
// copy: the parameters and moments equal the plain optimizer's, bit for bit.
TEST(OptimizerSharding, OneRankTrainsAsTheUnshardedOptimizer) {
  Model plain, sharded;
  TrainingSpec a{plain.loss, plain.params, nn::optimizer_nodes({"adam", 1e-2}), {}};
  TrainingSpec b{sharded.loss,
                 sharded.params,
                 dist::shard_optimizer_states(nn::optimizer_nodes({"adam", 1e-2}), 0, 1),
                 {}};
  CompileOptions options;
  options.passes.disabled = {"all"};
  CompiledStep sa(plain.g, a, options), sb(sharded.g, b, options);
  EXPECT_EQ(count_ops(sharded.g, "all_gather"), 1);
  EXPECT_EQ(count_ops(sharded.g, "adam"), 3);
  for (int step = 0; step < 3; ++step) {
    sa.train(feeds(), {});
    sb.train(feeds(), {});
  }
  auto sa_states = state_index(sa.executor()), sb_states = state_index(sb.executor());
  ASSERT_EQ(sa_states.size(), sb_states.size());
  for (const auto& [key, t] : sa_states) {
    ASSERT_TRUE(sb_states.count(key)) << key;
    const Tensor& u = *sb_states.at(key);
    ASSERT_EQ(t->nbytes(), u.nbytes()) << key;
    EXPECT_EQ(std::memcmp(t->raw_data(), u.raw_data(), u.nbytes()), 0) << key;
  }
}

// A rank of two owns w2 and b1 (12 elements): only their steps are built, and the others'
// parameters are copied out of the gathered shards at their owners' offsets.
TEST(OptimizerSharding, ARankBuildsOnlyItsStepsAndCopiesTheRest) {
  Model m;
  OptimizerNodes sharded = dist::shard_optimizer_states(nn::optimizer_nodes({"adam", 1e-2}), 1, 2);
  std::vector<NodeId> targets = sharded(m.g, m.params, m.params);  // any f32 values as grads
  EXPECT_EQ(count_ops(m.g, "adam"), 2);
  EXPECT_EQ(count_ops(m.g, "bucket_assign"), 1);
  EXPECT_EQ(targets.size(), 3u);
  const Node& assign = m.g.node(targets.back());
  EXPECT_EQ(assign.op->name, "bucket_assign");
  EXPECT_EQ(assign.inputs[0], m.params[0]);  // w1, rank 0's, at offset 0 of rank 0's shard
  EXPECT_EQ(assign.attrs.get_int("offset"), 0);
  const TensorType gathered = m.g.value(assign.inputs[1]).type;
  EXPECT_EQ(gathered.shape, (Shape{2 * 12}));  // shards padded to the larger one (12, 12)
  expect_error([] { dist::shard_optimizer_states({}, 0, 2); }, {"zero1", "no optimizer"});
  expect_error(
      [] {
        dist::shard_optimizer_states(nn::optimizer_nodes({"adam", 1e-2}), 2, 2);
      },
      {"zero1", "rank 2 of 2"});
}

TEST(CollectiveOps, BadOffsetsAndShapesAreErrorsNamingTheValues) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3}});
  expect_error(
      [&] {
        g.apply1("bucket_begin", {x}, {{"size", int64_t{5}}, {"offset", int64_t{0}}});
      },
      {"bucket_begin", "offset", "6 elements", "bucket of 5"});
  ValueId b = g.apply1("bucket_begin", {x}, {{"size", int64_t{10}}, {"offset", int64_t{0}}});
  expect_error(
      [&] {
        g.apply1("bucket_put", {b, x}, {{"offset", int64_t{5}}});
      },
      {"bucket_put", "offset' = 5", "bucket of 10"});
  expect_error(
      [&] {
        g.apply1("bucket_get", {b}, {{"offset", int64_t{8}}, {"shape", Shape{3}}});
      },
      {"bucket_get", "offset' = 8", "3 elements"});
  expect_error(
      [&] {
        g.apply1("all_reduce", {x}, {{"op", std::string("mean")}});
      },
      {"all_reduce", "mean"});
  // The in-place bucket reduce: a flat bucket only, and a reduction it knows.
  expect_error(
      [&] {
        g.apply1("bucket_all_reduce", {x}, {{"op", std::string("avg")}});
      },
      {"bucket_all_reduce", "rank"});
  expect_error(
      [&] {
        g.apply1("bucket_all_reduce", {b}, {{"op", std::string("mean")}});
      },
      {"bucket_all_reduce", "mean"});
  expect_error(
      [&] {
        g.apply1("all_gather", {x}, {{"ranks", int64_t{2}}});
      },
      {"all_gather", "rank"});
  expect_error(
      [&] {
        g.apply1("all_gather", {b}, {{"ranks", int64_t{0}}});
      },
      {"all_gather", "ranks"});
  ValueId y = g.input("y", {DType::f32, {4}});
  expect_error(
      [&] {
        g.apply("bucket_assign", {y, b}, {{"offset", int64_t{7}}});
      },
      {"bucket_assign", "offset' = 7", "4 elements", "bucket of 10"});
  // A graph built for two ranks, run in one process: an error naming both counts.
  Graph h;
  ValueId v = h.input("v", {DType::f32, {3}});
  ValueId all = h.apply1("all_gather", {v}, {{"ranks", int64_t{2}}});
  Executor ex(h, Device::cpu());
  expect_error(
      [&] {
        ex.run({{"v", Tensor::from_doubles({3}, {1, 2, 3}, DType::f32)}}, {all});
      },
      {"all_gather", "built for 2 ranks", "has 1"});
}

// A stand-in group of two, for the trainer's checks (no collective is ever called).
class FakeComm final : public Communicator {
 public:
  explicit FakeComm(DeviceType memory) : memory_(memory) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  DeviceType memory() const override { return memory_; }
  void all_reduce(void*, int64_t, DType, ReduceOp, void*) override { ADD_FAILURE(); }
  void broadcast(void*, int64_t, int, void*) override { ADD_FAILURE(); }
  void all_gather(const void*, void*, int64_t, void*) override { ADD_FAILURE(); }
  void barrier() override { ADD_FAILURE(); }
  void set_timeout(std::chrono::milliseconds) override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1); }

 private:
  DeviceType memory_;
};

nn::Dataset rows(int64_t n) {
  nn::Dataset d;
  d.features = 64;
  d.x.assign(static_cast<size_t>(n * 64), 0.5f);
  d.labels.assign(static_cast<size_t>(n), 1);
  return d;
}

TEST(DataParallelTrainer, RefusesWhatItCannotDoRight) {
  nn::Dataset data = rows(64);
  nn::TrainConfig c;
  c.mlp.hidden = {8};
  c.mlp.batch = 16;
  FakeComm cuda_comm(DeviceType::cuda), cpu_comm(DeviceType::cpu);
  c.comm = &cuda_comm;  // a CUDA communicator for a CPU model
  expect_error([&] { nn::Trainer t(c, data, data); }, {"fake", "cuda", "cpu"});
  c.comm = &cpu_comm;
  c.drop_last = false;
  expect_error([&] { nn::Trainer t(c, data, data); }, {"drop_last"});
  c.drop_last = true;
  c.mlp.batch = 40;  // a global batch of 80 rows > 64
  expect_error([&] { nn::Trainer t(c, data, data); }, {"64 rows", "40 x 2 ranks"});
}

}  // namespace
}  // namespace qg
