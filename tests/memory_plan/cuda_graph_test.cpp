// CUDA-graph capture and replay of a StaticRun (GPU only; skipped without a device): a
// replayed graph must leave the same outputs and state as the same number of plain launches,
// bit for bit, for fused observer + fake-quant graphs (whose kernels allocate scratch) and for
// a whole QAT training step (forward, backward, SGD).
#include <gtest/gtest.h>

#include "bench/harness/perf_cases.h"
#include "runtime/backend.h"
#include "runtime/static_run.h"
#include "tests/core/test_util.h"
#include "tests/memory_plan/plan_test_util.h"

#define QG_GPU_OR_SKIP()                                                                           \
  do {                                                                                             \
    if (!::qg::cuda_available()) GTEST_SKIP() << "no CUDA device present (or built without CUDA)"; \
  } while (0)

namespace qg {
namespace {

const Device kGpu = Device::cuda(0);

Tensor random_like(const TensorType& t, int seed) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>(static_cast<int64_t>((i * 2654435761u + seed * 97) % 2001) - 1000) /
           250.0;
  return Tensor::from_doubles(t.shape, v, t.dtype);
}

// One perf case, two executors: A launches once, captures, replays `n` times; B launches
// 1 + n times. Inputs change between steps through write_input (same addresses).
void check_case_replay(const bench::PerfCase& c, bool fused, int n) {
  SCOPED_TRACE(c.label() + (fused ? " fused" : " unfused"));
  Graph g;
  ValueId x = g.input("x", {c.dtype, c.shape});
  std::vector<ValueId> fetches = c.build(g, x);
  for (size_t i = 0; i < fetches.size(); ++i) g.set_name(fetches[i], "out" + std::to_string(i));
  optimize(g, fused ? PassOptions{} : PassOptions{{"all"}});
  for (size_t i = 0; i < fetches.size(); ++i) fetches[i] = g.at("out" + std::to_string(i));
  auto feeds = [&](int k) {
    Executor::Feeds f;
    for (ValueId in : g.inputs()) f[g.value(in).name] = random_like(g.value(in).type, k).to(kGpu);
    return f;
  };
  Executor ea(g, kGpu), eb(g, kGpu);
  StaticRun ra(ea, feeds(0), fetches), rb(eb, feeds(0), fetches);
  for (StaticRun* r : {&ra, &rb}) {
    for (const auto& [name, t] : feeds(1)) r->write_input(name, t);
    r->launch();
  }
  ra.capture();
  EXPECT_TRUE(ra.captured());
  EXPECT_GE(ra.graph_nodes(), ra.kernels_per_launch());
  for (int k = 0; k < n; ++k) {
    for (StaticRun* r : {&ra, &rb})
      for (const auto& [name, t] : feeds(2 + k)) r->write_input(name, t);
    ra.replay();
    rb.launch();
  }
  ra.synchronize();
  rb.synchronize();
  for (ValueId v : fetches)
    EXPECT_TRUE(testing::same_bytes(ra.value(v), rb.value(v))) << "value " << g.value(v).name;
  testing::expect_same_tensors(testing::all_state(ea), testing::all_state(eb), "state");
}

TEST(GpuCudaGraph, ObserverFakeQuantReplayMatchesLaunches) {
  QG_GPU_OR_SKIP();
  for (const bench::PerfCase& c : bench::perf_cases(DeviceType::cuda, /*quick=*/true)) {
    if (c.name.rfind("obs+fq", 0) != 0 && c.name.rfind("lsq", 0) != 0 &&
        c.name.rfind("fq fwd+bwd", 0) != 0)
      continue;
    check_case_replay(c, /*fused=*/true, 4);
    if (c.fusable) check_case_replay(c, /*fused=*/false, 4);
  }
}

TEST(GpuCudaGraph, FusedPerTensorKernelGetsScratchFromThePool) {
  QG_GPU_OR_SKIP();
  // The fused per-tensor kernel allocates per-block partials: they must come from the pool
  // (a non-zero pool after the first launch) and the capture must succeed.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {1024, 1024}});
  auto qp = g.apply("moving_average_observer", {x});
  auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]});
  g.set_name(fq[0], "y");
  optimize(g, PassOptions{});
  ValueId y = g.at("y");
  Executor exec(g, kGpu);
  StaticRun run(exec, {{"x", random_like({DType::f32, {1024, 1024}}, 3).to(kGpu)}}, {y});
  testing::expect_error([&] { run.capture(); }, {"capture needs one launch() first"});
  run.launch();
  EXPECT_GT(run.scratch_bytes(), 0);
  run.capture();
  run.replay();
  run.synchronize();
  EXPECT_THROW(run.bind_input("x", run.value(y)), Error);
}

// The QAT training step: A captures after one launch and replays; B launches. Same inputs
// each step, written into the bound inputs.
void check_training_step_replay(bool fused, int n) {
  SCOPED_TRACE(fused ? "fused" : "unfused");
  testing::QatStepGraph q(fused);
  Executor ea(q.graph, kGpu), eb(q.graph, kGpu), ref(q.graph, kGpu);
  StaticRun ra(ea, q.feeds(0, kGpu), q.fetches, q.step.sgd_steps);
  StaticRun rb(eb, q.feeds(0, kGpu), q.fetches, q.step.sgd_steps);
  std::vector<Tensor> ref_out = ref.run(q.feeds(0, kGpu), q.fetches, q.step.sgd_steps);
  for (StaticRun* r : {&ra, &rb}) {
    for (const auto& [name, t] : q.feeds(1, kGpu)) r->write_input(name, t);
    r->launch();
  }
  ref_out = ref.run(q.feeds(1, kGpu), q.fetches, q.step.sgd_steps);
  ra.capture();
  double first_loss = 0;
  for (int k = 0; k < n; ++k) {
    for (StaticRun* r : {&ra, &rb})
      for (const auto& [name, t] : q.feeds(2 + k, kGpu)) r->write_input(name, t);
    ra.replay();
    rb.launch();
    ref_out = ref.run(q.feeds(2 + k, kGpu), q.fetches, q.step.sgd_steps);
    if (k == 0) {
      ra.synchronize();
      first_loss = ra.value(q.fetches[0]).to(Device::cpu()).at(0);
    }
  }
  ra.synchronize();
  rb.synchronize();
  std::vector<Tensor> got_a, got_b;
  for (ValueId v : q.fetches) {
    got_a.push_back(ra.value(v));
    got_b.push_back(rb.value(v));
  }
  testing::expect_same_tensors(got_b, got_a, "replay vs launches: fetches");
  testing::expect_same_tensors(testing::all_state(eb), testing::all_state(ea),
                               "replay vs launches: state");
  // The planned static run agrees with the executor, which allocates every value anew.
  testing::expect_same_tensors(ref_out, got_b, "launches vs executor: fetches");
  testing::expect_same_tensors(testing::all_state(ref), testing::all_state(eb),
                               "launches vs executor: state");
  // Training moved the parameters: the replays did real work.
  double last_loss = ra.value(q.fetches[0]).to(Device::cpu()).at(0);
  EXPECT_NE(first_loss, last_loss);
}

TEST(GpuCudaGraph, QatTrainingStepReplayMatchesLaunchesUnfused) {
  QG_GPU_OR_SKIP();
  check_training_step_replay(false, 6);
}

TEST(GpuCudaGraph, QatTrainingStepReplayMatchesLaunchesFused) {
  QG_GPU_OR_SKIP();
  check_training_step_replay(true, 6);
}

}  // namespace
}  // namespace qg
