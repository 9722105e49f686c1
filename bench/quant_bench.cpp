// Google Benchmark suite over the PERF.md cases, on the CPU and (when present) the GPU.
// Each benchmark times one launch per iteration (CUDA events on the GPU) and reports the
// device copy of the same bytes, measured in the same run, as the `copy_us` counter and the
// ratio as `x_copy`. Run with --benchmark_format=json to keep the numbers.
#include <benchmark/benchmark.h>

#include <memory>

#include "bench/harness/device_timer.h"
#include "bench/harness/perf_cases.h"
#include "runtime/backend.h"

namespace {

void register_device(qg::Device device, bool quick) {
  for (const auto& c : qg::bench::perf_cases(device.type, quick)) {
    std::vector<std::string> variants =
        c.fusable ? std::vector<std::string>{"fused", "unfused"} : std::vector<std::string>{"-"};
    for (const auto& variant : variants) {
      std::string name = std::string(device.is_cpu() ? "cpu/" : "cuda/") + c.label() +
                         (variant == "-" ? "" : "/" + variant);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [c, device, variant](benchmark::State& st) {
            std::unique_ptr<qg::bench::CaseRunner> runner;
            try {
              runner = std::make_unique<qg::bench::CaseRunner>(c, device, variant != "unfused");
            } catch (const std::exception& e) {
              st.SkipWithError(e.what());
              return;
            }
            double copy = qg::bench::copy_us(device, runner->input_bytes(), 20);
            for (int w = 0; w < 3; ++w) runner->launch(w);
            int i = 0;
            for (auto _ : st) {
              double us = qg::bench::median_us(
                  runner->context(), [&](int k) { runner->launch(i + k); }, 1, 0);
              ++i;
              st.SetIterationTime(us * 1e-6);
            }
            st.counters["copy_us"] = copy;
            st.counters["kernels"] = runner->kernels();
            st.SetBytesProcessed(st.iterations() * runner->input_bytes());
          })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = std::getenv("QG_BENCH_QUICK") != nullptr;
  register_device(qg::Device::cpu(), quick);
  std::unique_ptr<qg::Backend> gpu;
  if (qg::cuda_available()) {
    gpu = qg::make_backend(qg::Device::cuda());  // brings up the device (allocator, stream)
    register_device(qg::Device::cuda(), quick);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
