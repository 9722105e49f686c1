// `qat memplan`: peak memory of one step, fused and unfused, as the memory planner lays it
// out (runtime/memory_plan.h). For the PERF.md cases and a QAT MLP training step it prints
// the arena (the peak of the values a step produces, with dead values' bytes reused) against
// the naive sum (every value in its own buffer), and the persistent bytes the step also holds
// (inputs, parameters, constants and node state), which no plan can reuse.
// Planning needs no device: the graphs are built and planned on the host.
#include <cstdio>

#include "apps/qat/commands.h"
#include "bench/harness/device_timer.h"
#include "bench/harness/perf_cases.h"
#include "bench/harness/qat_step.h"
#include "runtime/backend.h"
#include "runtime/memory_plan.h"
#include "runtime/passes/pass.h"
#include "runtime/static_run.h"
#ifdef QG_WITH_CUDA
#include "device/cuda/cuda_allocator.h"
#endif

namespace qg::cli {

namespace {

struct MemplanOptions {
  std::string device = "cuda";
  bool quick = false;
  std::string filter;
  int time_reps = 0;  // > 0: also time the QAT steps (executor, static launch, graph replay)
};

// Inputs, constants, parameters and node states of the nodes that run.
int64_t persistent_bytes(const Graph& g, const std::vector<NodeId>& order) {
  int64_t total = 0;
  auto bytes = [](const TensorType& t) {
    return t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
  };
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.op->is_source) total += bytes(g.value(n.outputs[0]).type);
    if (n.op->name == "constant" || n.op->name == "parameter") continue;  // state = its value
    for (const StateSpec& s : n.states) total += bytes(s.type);
  }
  return total;
}

struct Row {
  std::string label, variant;
  int kernels = 0;
  MemoryPlan plan;
  int64_t persistent = 0;
};

Row plan_row(const std::string& label, bool fused, Graph& g, std::vector<ValueId> fetches,
             const std::vector<NodeId>& targets) {
  // Fetches are re-read by name after the pass (fusion replaces the producing nodes).
  for (size_t i = 0; i < fetches.size(); ++i)
    if (g.value(fetches[i]).name.empty()) g.set_name(fetches[i], "fetch" + std::to_string(i));
  std::vector<std::string> names;
  for (ValueId v : fetches) names.push_back(g.value(v).name);
  optimize(g, fused ? PassOptions{} : PassOptions{{"all"}});
  for (size_t i = 0; i < fetches.size(); ++i) fetches[i] = g.at(names[i]);
  Row r;
  r.label = label;
  r.variant = fused ? "fused" : "unfused";
  std::vector<NodeId> order = needed_order(g, fetches, targets);
  r.plan = plan_memory(g, order, fetches);
  r.persistent = persistent_bytes(g, order);
  for (NodeId id : order)
    if (!g.node(id).op->is_source) ++r.kernels;
  return r;
}

void print_row(const Row& r) {
  const MemoryPlan& p = r.plan;
  double ratio = p.naive_bytes > 0
                     ? static_cast<double>(p.arena_bytes) / static_cast<double>(p.naive_bytes)
                     : 1.0;
  std::printf("%-52s %-8s %7d %7d %12s %12s %6.2f %12s\n", r.label.c_str(), r.variant.c_str(),
              r.kernels, p.num_buffers(), format_bytes(p.naive_bytes).c_str(),
              format_bytes(p.arena_bytes).c_str(), ratio, format_bytes(r.persistent).c_str());
}

struct MlpShape {
  int64_t batch, in, hidden, classes;
};

// Times one QAT MLP step per launch three ways on `device`: Executor::run (allocates and
// synchronises every step), StaticRun::launch (the planned arena, kernels enqueued in order)
// and, on CUDA, one replay of the captured CUDA graph of the same launch.
void time_step(const MlpShape& m, bool fused, Device device, int reps) {
  Graph g;
  bench::QatStep st = bench::build_qat_step(g, m.batch, m.in, m.hidden, m.classes);
  optimize(g, fused ? PassOptions{} : PassOptions{{"all"}});
  std::vector<ValueId> fetches = {g.at("loss")};
  Executor::Feeds feeds = {{"x", bench::qat_step_x(m.batch, m.in, 0).to(device)},
                           {"labels", bench::qat_step_labels(m.batch, m.classes, 0).to(device)}};
  Executor exec(g, device);
  double exec_us = bench::median_us(
      exec.context(), [&](int) { exec.run(feeds, fetches, st.sgd_steps); }, reps);
  // Measured, on CUDA: what one executor run adds to the caching allocator's bytes in use
  // at its peak (it frees each value after its last reader), against the static run's
  // arena + scratch (allocated once).
  std::string exec_peak = "-";
#ifdef QG_WITH_CUDA
  if (!device.is_cpu()) {
    cuda::CachingAllocator& a = cuda::allocator(device.index);
    size_t before = a.bytes_in_use();
    a.reset_peak();
    exec.run(feeds, fetches, st.sgd_steps);
    exec_peak = format_bytes(static_cast<int64_t>(a.peak_bytes_in_use() - before));
  }
#endif
  StaticRun run(exec, feeds, fetches, st.sgd_steps);
  double launch_us = bench::median_us(
      exec.context(), [&](int) { run.launch(); }, reps);
  double replay_us = 0;
  if (!device.is_cpu()) {
    run.capture();
    replay_us = bench::median_us(
        exec.context(), [&](int) { run.replay(); }, reps);
    run.synchronize();
  }
  std::string shape =
      std::to_string(m.in) + "-" + std::to_string(m.hidden) + "-" + std::to_string(m.classes);
  char replay[32] = "-";
  if (!device.is_cpu()) std::snprintf(replay, sizeof replay, "%.1f", replay_us);
  std::printf("%-8s %-6lld %-16s %-8s %8d %12.1f %12.1f %12s %12s %12s %10s\n",
              device.str().c_str(), static_cast<long long>(m.batch), shape.c_str(),
              fused ? "fused" : "unfused", run.kernels_per_launch(), exec_us, launch_us, replay,
              exec_peak.c_str(), format_bytes(run.plan().arena_bytes).c_str(),
              format_bytes(run.scratch_bytes()).c_str());
}

}  // namespace

void add_memplan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "memplan", "Peak step memory from the memory planner, fused and unfused (no device needed)");
  auto o = std::make_shared<MemplanOptions>();
  cmd->add_option("--device", o->device, "Which PERF.md shape set: cuda (GPU shapes) or cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--quick", o->quick, "Small shapes only");
  cmd->add_option("--filter", o->filter, "Only cases whose label contains this text");
  cmd->add_option("--time", o->time_reps,
                  "Also time the QAT MLP steps (median of N): executor run, static launch and "
                  "CUDA-graph replay (on CUDA when present)")
      ->check(CLI::Range(0, 100000));
  cmd->callback([o] {
    DeviceType device = o->device == "cpu" ? DeviceType::cpu : DeviceType::cuda;
    std::printf(
        "qat memplan (%s shapes): arena = planned peak of one step's values "
        "(512-byte aligned, dead values' bytes reused); naive = one buffer per value; "
        "persistent = inputs, parameters and state\n",
        o->quick ? "quick" : (o->device == "cpu" ? "CPU" : "GPU"));
    std::printf("%-52s %-8s %7s %7s %12s %12s %6s %12s\n", "case", "variant", "kernels", "values",
                "naive", "arena", "ratio", "persistent");
    auto wanted = [&](const std::string& label) {
      return o->filter.empty() || label.find(o->filter) != std::string::npos;
    };
    for (const auto& c : bench::perf_cases(device, o->quick)) {
      if (!wanted(c.label())) continue;
      for (bool fused : {true, false}) {
        if (!fused && !c.fusable) continue;
        Graph g;
        ValueId x = g.input("x", {c.dtype, c.shape});
        print_row(plan_row(c.label(), c.fusable && fused, g, c.build(g, x), {}));
        if (!c.fusable) break;
      }
    }
    std::vector<MlpShape> mlps = {{256, 784, 256, 10}, {512, 1024, 4096, 1000}};
    if (o->quick) mlps = {{32, 48, 64, 10}};
    for (const MlpShape& m : mlps) {
      std::string label = "qat mlp step b" + std::to_string(m.batch) + " " + std::to_string(m.in) +
                          "-" + std::to_string(m.hidden) + "-" + std::to_string(m.classes) +
                          " f32 (fwd+bwd+sgd)";
      if (!wanted(label)) continue;
      for (bool fused : {true, false}) {
        Graph g;
        bench::QatStep st = bench::build_qat_step(g, m.batch, m.in, m.hidden, m.classes);
        std::vector<ValueId> fetches = {st.loss};
        print_row(plan_row(label, fused, g, fetches, st.sgd_steps));
      }
    }
    if (o->time_reps <= 0) return;
    Device run_on = cuda_available() ? Device::cuda() : Device::cpu();
    auto backend = make_backend(run_on);  // brings the device up (allocator, stream) first
    std::printf(
        "\nQAT MLP step, median us per step (%d reps); replay = one CUDA-graph launch; "
        "exec peak = bytes one executor run adds at its peak (CUDA allocator)\n",
        o->time_reps);
    std::printf("%-8s %-6s %-16s %-8s %8s %12s %12s %12s %12s %12s %10s\n", "device", "batch",
                "shape", "variant", "kernels", "executor", "launch", "replay", "exec peak", "arena",
                "scratch");
    for (const MlpShape& m : mlps)
      for (bool fused : {true, false}) time_step(m, fused, run_on, o->time_reps);
  });
}

}  // namespace qg::cli
