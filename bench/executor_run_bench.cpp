// Executor::run on the CPU, the path `qat train` takes: every run allocates each node's
// outputs afresh, so what the CPU allocator does with freed blocks (keep them, or hand them
// back to the kernel) decides whether a run touches fresh pages. Each benchmark reports the
// minor page faults per run (getrusage) next to the time; QG_CPU_CACHE_BYTES=0 in the
// environment measures the allocator without its cache.
//   build/bench/executor_run_bench [--benchmark_filter=fq]
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "bench/harness/perf_cases.h"
#include "bench/harness/qat_step.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace {

long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

qg::Tensor random_tensor(const qg::TensorType& type, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> data(static_cast<size_t>(type.numel()));
  for (auto& d : data) d = dist(rng);
  return qg::Tensor::from_doubles(type.shape, data, type.dtype);
}

// Times `step` per iteration after two warm-up runs; the page-fault counter is per run.
void time_runs(benchmark::State& st, const std::function<void()>& step) {
  step();
  step();
  const long faults_before = minor_faults();
  for (auto _ : st) step();
  st.counters["minflt_per_run"] =
      static_cast<double>(minor_faults() - faults_before) / static_cast<double>(st.iterations());
}

void register_fq_cases() {
  const qg::Shape shape{8192, 4096};
  for (const auto& c : qg::bench::perf_cases(qg::DeviceType::cpu, false, shape)) {
    if (c.label().rfind("fq fwd+bwd", 0) != 0 || c.dtype != qg::DType::f32) continue;
    benchmark::RegisterBenchmark(("executor_run/" + c.label()).c_str(),
                                 [c](benchmark::State& st) {
                                   qg::Graph g;
                                   qg::ValueId x = g.input("x", {c.dtype, c.shape});
                                   std::vector<qg::ValueId> fetches = c.build(g, x);
                                   qg::Executor exec(g);
                                   qg::Executor::Feeds feeds;
                                   unsigned seed = 1;
                                   for (qg::ValueId in : g.inputs())
                                     feeds[g.value(in).name] =
                                         random_tensor(g.value(in).type, seed++);
                                   time_runs(st, [&] { exec.run(feeds, fetches); });
                                 })
        ->Unit(benchmark::kMillisecond)
        ->MinTime(2.0);
  }
}

// The QAT MLP training step of `qat memplan --time` (forward, backward, SGD), fused.
void register_qat_step(int64_t batch, int64_t in, int64_t hidden, int64_t classes) {
  std::string name = "executor_run/qat mlp step " + std::to_string(batch) + "x" +
                     std::to_string(in) + "-" + std::to_string(hidden) + "-" +
                     std::to_string(classes);
  benchmark::RegisterBenchmark(
      name.c_str(),
      [=](benchmark::State& st) {
        qg::Graph g;
        qg::bench::QatStep step = qg::bench::build_qat_step(g, batch, in, hidden, classes);
        qg::optimize(g, qg::PassOptions{});
        std::vector<qg::ValueId> fetches = {g.at("loss")};
        qg::Executor exec(g);
        qg::Executor::Feeds feeds = {{"x", qg::bench::qat_step_x(batch, in, 0)},
                                     {"labels", qg::bench::qat_step_labels(batch, classes, 0)}};
        time_runs(st, [&] { exec.run(feeds, fetches, step.sgd_steps); });
      })
      ->Unit(benchmark::kMillisecond)
      ->MinTime(2.0);  // the wide step takes ~0.3 s: a few runs, not two
}

}  // namespace

int main(int argc, char** argv) {
  register_fq_cases();
  register_qat_step(64, 64, 128, 10);       // the digits MLP's sizes
  register_qat_step(1024, 1024, 4096, 10);  // a wider step whose buffers glibc maps fresh
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
