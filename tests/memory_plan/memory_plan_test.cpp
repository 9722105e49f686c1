// The memory planner (runtime/memory_plan.h), the scratch pool, and StaticRun running on a
// planned arena: sharing, non-overlap, views, fetched values, and bit-identical results.
#include <gtest/gtest.h>

#include "bench/harness/perf_cases.h"
#include "runtime/scratch_pool.h"
#include "runtime/static_run.h"
#include "tests/core/test_util.h"
#include "tests/memory_plan/plan_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::expect_plan_invariants;

constexpr int64_t kN = 256;  // f32[256] = 1 KiB: two alignment units
constexpr int64_t kBytes = kN * 4;

TEST(MemoryPlan, ChainReusesDeadBuffers) {
  // x -> a -> b -> c -> d: each value dies when the next is made, so two buffers suffice.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId a = g.apply1("relu", {x});
  ValueId b = g.apply1("neg", {a});
  ValueId c = g.apply1("relu", {b});
  ValueId d = g.apply1("neg", {c});
  MemoryPlan plan = plan_memory(g, needed_order(g, {d}), {d});
  expect_plan_invariants(plan);
  EXPECT_EQ(plan.num_buffers(), 4);
  EXPECT_EQ(plan.naive_bytes, 4 * kBytes);
  EXPECT_EQ(plan.arena_bytes, 2 * kBytes);
  EXPECT_EQ(plan.find(a)->offset, plan.find(c)->offset);  // a is dead when c is made
  EXPECT_EQ(plan.find(b)->offset, plan.find(d)->offset);
  EXPECT_NE(plan.find(a)->offset, plan.find(b)->offset);  // a is read while b is written
  EXPECT_EQ(plan.find(x), nullptr);                       // inputs are fed, not planned
}

TEST(MemoryPlan, OverlappingLifetimesNeverShare) {
  // a is read by the last node, so it lives across everything; b, c and d cannot use it.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId a = g.apply1("relu", {x});
  ValueId b = g.apply1("neg", {x});
  ValueId c = g.apply1("relu", {b});
  ValueId d = g.apply1("add", {c, a});
  MemoryPlan plan = plan_memory(g, needed_order(g, {d}), {d});
  expect_plan_invariants(plan);  // checks every pair live at one position
  EXPECT_EQ(plan.find(a)->last, plan.find(d)->first);
  // Whichever branch the order runs first, one of the four can reuse a dead buffer.
  EXPECT_EQ(plan.arena_bytes, 3 * kBytes);
}

TEST(MemoryPlan, ViewsExtendTheLifetimeOfWhatTheyView) {
  // r = reshape(a) and s = stop_gradient(r) own no bytes; a must live until s's last reader,
  // so the unrelated values made in between may not take a's bytes.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId a = g.apply1("relu", {x});
  ValueId r = g.apply1("reshape", {a}, {{"shape", Shape{16, 16}}});
  ValueId s = g.apply1("stop_gradient", {r});
  ValueId b = g.apply1("neg", {x});
  ValueId c = g.apply1("relu", {b});
  ValueId e = g.apply1("neg", {c});
  ValueId y = g.apply1("add", {g.apply1("reshape", {e}, {{"shape", Shape{16, 16}}}), s});
  MemoryPlan plan = plan_memory(g, needed_order(g, {y}), {y});
  expect_plan_invariants(plan);
  EXPECT_EQ(plan.find(r), nullptr);
  EXPECT_EQ(plan.find(s), nullptr);
  EXPECT_EQ(plan.alias_root[s], a);
  // a is read only through its views; its last use is s's reader, so the pairwise check
  // above covers every value made while the views were still to be read.
  EXPECT_EQ(plan.find(a)->last, plan.find(y)->first);
}

TEST(MemoryPlan, FetchedValuesLiveToTheEnd) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId a = g.apply1("relu", {x});
  ValueId b = g.apply1("neg", {a});
  ValueId c = g.apply1("relu", {b});
  ValueId d = g.apply1("neg", {c});
  // A view of a fetched-late value: fetching the view keeps its root too.
  ValueId rb = g.apply1("reshape", {b}, {{"shape", Shape{16, 16}}});
  std::vector<ValueId> fetches = {a, rb, d};
  MemoryPlan plan = plan_memory(g, needed_order(g, fetches), fetches);
  expect_plan_invariants(plan);
  int end = static_cast<int>(plan.order.size());
  EXPECT_EQ(plan.find(a)->last, end);
  EXPECT_EQ(plan.find(b)->last, end);
  EXPECT_EQ(plan.find(d)->last, end);
  EXPECT_EQ(plan.arena_bytes, 4 * kBytes);  // nothing can be shared: c overlaps a and b
}

TEST(MemoryPlan, OutputsOfOneNodeAndUnreadOutputsGetTheirOwnBytes) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {64, 32}});
  auto qp = g.apply("minmax_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});  // mask is never read
  ValueId y = g.apply1("relu", {fq[0]});
  MemoryPlan plan = plan_memory(g, needed_order(g, {y}), {y});
  expect_plan_invariants(plan);
  const PlannedBuffer* mask = plan.find(fq[1]);
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->first, mask->last);
  EXPECT_NE(plan.find(fq[0])->offset, mask->offset);
}

TEST(MemoryPlan, PerfCasesAndQatStepKeepTheInvariants) {
  for (const bench::PerfCase& c : bench::perf_cases(DeviceType::cpu, /*quick=*/true))
    for (bool fused : {false, true}) {
      SCOPED_TRACE(c.label() + (fused ? " fused" : " unfused"));
      Graph g;
      ValueId x = g.input("x", {c.dtype, c.shape});
      std::vector<ValueId> fetches = c.build(g, x);
      for (size_t i = 0; i < fetches.size(); ++i) g.set_name(fetches[i], "out" + std::to_string(i));
      optimize(g, fused ? PassOptions{} : PassOptions{{"all"}});
      for (size_t i = 0; i < fetches.size(); ++i) fetches[i] = g.at("out" + std::to_string(i));
      expect_plan_invariants(plan_memory(g, needed_order(g, fetches), fetches));
    }
  for (bool fused : {false, true}) {
    testing::QatStepGraph q(fused);
    MemoryPlan plan =
        plan_memory(q.graph, needed_order(q.graph, q.fetches, q.step.sgd_steps), q.fetches);
    expect_plan_invariants(plan);
    EXPECT_LT(plan.arena_bytes, plan.naive_bytes);
  }
}

// A gradient whose only reader is the copy into its bucket is placed in the bucket
// (gradient_as_bucket_view): its producer writes where the all-reduce reads, and the copy is
// a no-op. Here g1 and g2 (1 KiB each, at byte offsets 0 and 1024) go into the bucket; g3,
// which another node reads as well, keeps a buffer of its own and is copied. StaticRun on the
// plan gives the executor's values.
TEST(MemoryPlan, GradientsArePlacedInTheirBucket) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId g1 = g.apply1("relu", {x});
  ValueId g2 = g.apply1("neg", {x});
  ValueId g3 = g.apply1("sqrt", {g.apply1("relu", {x})});
  ValueId b = g.apply1("bucket_begin", {g1}, {{"size", 3 * kN}, {"offset", 0}});
  b = g.apply1("bucket_put", {b, g2}, {{"offset", kN}});
  b = g.apply1("bucket_put", {b, g3}, {{"offset", 2 * kN}});
  ValueId r = g.apply1("bucket_all_reduce", {b}, {{"op", std::string("avg")}});
  std::vector<ValueId> outs;
  for (int64_t k = 0; k < 3; ++k)
    outs.push_back(
        g.apply1("neg", {g.apply1("bucket_get", {r}, {{"offset", k * kN}, {"shape", Shape{kN}}})}));
  outs.push_back(g.apply1("add", {g3, outs[0]}));  // g3's second reader
  MemoryPlan plan = plan_memory(g, needed_order(g, outs), outs);
  expect_plan_invariants(plan);
  const PlannedBuffer* bucket = plan.find(plan.alias_root[b]);  // bucket_begin's output
  ASSERT_NE(bucket, nullptr);
  const PlannedBuffer* p1 = plan.find(g1);
  const PlannedBuffer* p2 = plan.find(g2);
  const PlannedBuffer* p3 = plan.find(g3);
  ASSERT_TRUE(p1 && p2 && p3);
  EXPECT_EQ(p1->inside, plan.buffer_of[plan.alias_root[b]]);
  EXPECT_EQ(p1->offset, bucket->offset);
  EXPECT_EQ(p2->offset, bucket->offset + kBytes);
  EXPECT_EQ(p2->inside, p1->inside);
  EXPECT_EQ(p3->inside, -1);                                 // read by the add too
  EXPECT_EQ(bucket->first, std::min(p1->first, p2->first));  // live from its first member on

  std::vector<double> xs(kN);
  for (int64_t i = 0; i < kN; ++i) xs[static_cast<size_t>(i)] = 0.25 * static_cast<double>(i - 100);
  const Executor::Feeds feeds = {{"x", Tensor::from_doubles({kN}, xs, DType::f32)}};
  Executor ref(g), planned(g);
  const std::vector<Tensor> want = ref.run(feeds, outs);
  StaticRun run(planned, feeds, outs, {}, true);
  ASSERT_TRUE(run.memory_planned());
  for (int k = 0; k < 2; ++k) {
    run.launch();
    std::vector<Tensor> got;
    for (ValueId v : outs) got.push_back(run.value(v));
    testing::expect_same_tensors(want, got, "bucket members, launch " + std::to_string(k));
  }
}

TEST(TensorView, SharesStorageAndChecksBounds) {
  Tensor base = Tensor::zeros({1024}, DType::u8);
  Tensor v = base.view(512, {4, 8}, DType::f32);
  EXPECT_EQ(static_cast<char*>(v.raw_data()) - static_cast<char*>(base.raw_data()), 512);
  v.fill(2.0);
  EXPECT_EQ(base.at(512 + 3), 64);  // 2.0f = 0x40000000, little-endian
  expect_error(
      [&] {
        base.view(900, {4, 8}, DType::f32);
      },
      {"view of 128 bytes at offset 900", "1024-byte"});
  expect_error([&] { base.view(-1, {1}, DType::u8); }, {"reaches past"});
}

TEST(ScratchPool, ReplaysTheRecordedBuffers) {
  ScratchPool pool(Device::cpu());
  auto launch = [&](int64_t n0, int64_t n1, bool keep) {
    ScopedAllocator scope(DeviceType::cpu, &pool);
    std::vector<void*> got;
    Tensor kept;
    pool.begin_launch();
    pool.begin_step(0);
    {
      Tensor t0 = Tensor::empty({n0}, DType::f32);
      Tensor t1 = Tensor::empty({n1}, DType::f64);
      got = {t0.raw_data(), t1.raw_data()};
      if (keep) kept = t1;
    }
    pool.end_step("op_a");
    pool.begin_step(1);
    {
      Tensor t2 = Tensor::empty({8}, DType::u8);
      got.push_back(t2.raw_data());
    }
    pool.end_step("op_b");
    pool.end_launch();
    return got;
  };
  launch(100, 10, false);  // records
  EXPECT_TRUE(pool.recorded());
  EXPECT_EQ(pool.allocations_per_launch(), 3);
  EXPECT_EQ(pool.bytes(), 2 * kPlanAlignment);  // step 0's two blocks; step 1 reuses offset 0
  std::vector<void*> second = launch(100, 10, false);
  EXPECT_EQ(second, launch(100, 10, false));  // fixed addresses
  EXPECT_EQ(second[2], second[0]);            // steps run in order: step 1 reuses step 0's bytes
  EXPECT_NE(second[0], second[1]);
  // Fewer temporaries than recorded (an empty tensor allocates nothing) is fine.
  EXPECT_EQ(launch(100, 0, false)[0], second[0]);
  expect_error([&] { launch(1000, 10, false); }, {"the recorded launch did not"});
  expect_error([&] { launch(100, 10, true); }, {"op_a", "kept 1 temporary"});
  // Outside a scope, allocations go to the device allocator as before.
  Tensor outside = Tensor::empty({4}, DType::f32);
  EXPECT_TRUE(outside.defined());
}

// Runs `steps` training steps through (a) Executor::run, (b) StaticRun on the planned arena,
// (c) StaticRun with a buffer per value, each on its own executor over the same graph, and
// compares fetched values and every state bit for bit after each step.
void check_static_runs_match_executor(bool fused) {
  testing::QatStepGraph q(fused);
  const Graph& g = q.graph;
  Executor ref(g), planned(g), unplanned(g);
  // StaticRun's constructor runs step 0 through its executor; the reference does the same.
  std::vector<Tensor> ref_out = ref.run(q.feeds(0, Device::cpu()), q.fetches, q.step.sgd_steps);
  StaticRun rp(planned, q.feeds(0, Device::cpu()), q.fetches, q.step.sgd_steps, true);
  StaticRun ru(unplanned, q.feeds(0, Device::cpu()), q.fetches, q.step.sgd_steps, false);
  EXPECT_TRUE(rp.memory_planned());
  EXPECT_LT(rp.plan().arena_bytes, rp.plan().naive_bytes);
  for (int k = 1; k <= 3; ++k) {
    Executor::Feeds feeds = q.feeds(k, Device::cpu());
    ref_out = ref.run(feeds, q.fetches, q.step.sgd_steps);
    for (StaticRun* r : {&rp, &ru}) {
      for (const auto& [name, t] : feeds) r->write_input(name, t);
      r->launch();
    }
    std::vector<Tensor> got_p, got_u;
    for (ValueId v : q.fetches) {
      got_p.push_back(rp.value(v));
      got_u.push_back(ru.value(v));
    }
    testing::expect_same_tensors(ref_out, got_p, "planned fetches, step " + std::to_string(k));
    testing::expect_same_tensors(ref_out, got_u, "unplanned fetches, step " + std::to_string(k));
    testing::expect_same_tensors(testing::all_state(ref), testing::all_state(planned),
                                 "planned state, step " + std::to_string(k));
    testing::expect_same_tensors(testing::all_state(ref), testing::all_state(unplanned),
                                 "unplanned state, step " + std::to_string(k));
  }
  // The loss must actually move, or the comparison would be vacuous.
  EXPECT_NE(ref_out[0].at(0), 0.0);
}

TEST(StaticRunPlanned, QatStepMatchesExecutorBitForBitUnfused) {
  check_static_runs_match_executor(false);
}

TEST(StaticRunPlanned, QatStepMatchesExecutorBitForBitFused) {
  check_static_runs_match_executor(true);
}

TEST(StaticRunPlanned, ValuesAreViewsIntoOneArena) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {kN}});
  ValueId a = g.apply1("relu", {x});
  ValueId r = g.apply1("reshape", {a}, {{"shape", Shape{16, 16}}});
  ValueId y = g.apply1("neg", {r});
  Executor exec(g);
  Tensor xin = Tensor::from_doubles({kN}, std::vector<double>(kN, -1.5));
  StaticRun run(exec, {{"x", xin}}, {y});
  run.launch();
  EXPECT_EQ(run.value(r).raw_data(), run.value(a).raw_data());  // the view, not a copy
  EXPECT_EQ(run.value(y).at(0), -0.0);
  EXPECT_EQ(run.plan().arena_bytes, 2 * kBytes);
  expect_error([&] { run.capture(); }, {"capture needs a CUDA executor"});
  expect_error([&] { run.bind_input("nope", xin); }, {"no graph input named 'nope'"});
  expect_error([&] { run.write_input("x", Tensor::zeros({3}, DType::f32)); }, {"input 'x' is"});
}

}  // namespace
}  // namespace qg
