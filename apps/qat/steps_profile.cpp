// `qat steps --profile`: where one compiled step's time goes, per op (and with --floors, each
// op against its floor, steps_floors.h); on the GPU also per node of chosen ops.
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "apps/qat/steps_common.h"
#include "apps/qat/steps_floors.h"
#include "runtime/executor.h"

#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_check.h"
#endif

namespace qg::cli {
namespace {

// Prints per-op times (ms per step, and nodes per step), largest first.
void print_profile(const std::map<std::string, std::pair<double, int>>& per_op, int runs,
                   const char* what, const std::map<std::string, NodeCost>& costs,
                   const DevicePeaks* peaks) {
  double total = 0;
  for (const auto& [op, t] : per_op) total += t.first;
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(per_op.begin(), per_op.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("  profile (executor runs, %.3f ms per step %s):\n", total, what);
  for (size_t i = 0; i < rows.size() && i < 12; ++i)
    std::printf("    %-32s %8.3f ms %5.1f%%  (%d nodes)\n", rows[i].first.c_str(),
                rows[i].second.first, 100 * rows[i].second.first / total,
                rows[i].second.second / runs);
  if (peaks == nullptr) return;
  std::map<std::string, OpProfile> table;
  for (const auto& [op, t] : per_op) {
    OpProfile& p = table[op];
    p.ms = t.first;
    p.nodes = t.second / runs;
    auto c = costs.find(op);
    if (c != costs.end()) p.cost = c->second;
  }
  print_floor_table(table, *peaks);
}

// One node's cost added to its op's, `runs` times per step.
void add_cost(std::map<std::string, NodeCost>& costs, const Graph& g, const Node& n, int runs) {
  NodeCost c = node_cost(g, n);
  c.flops /= runs;
  c.flops_16bit /= runs;
  c.bytes /= runs;
  costs[n.op->name] += c;
}

// Where one step's CPU time goes, per op: the executor runs nodes one after the other on the
// calling thread (their kernels on the thread pool), so the wall time between the end of one
// node and the end of the next is that node's.
void profile_step_cpu(StepGraph& s, Device device, int runs, const DevicePeaks* peaks) {
  Executor exec(s.graph, device);
  exec.run(s.feeds, {s.loss}, s.updates);  // warm-up: allocations
  using Clock = std::chrono::steady_clock;
  std::map<std::string, std::pair<double, int>> per_op;
  std::map<std::string, NodeCost> costs;
  Clock::time_point last;
  exec.on_node = [&](const Node& n, const std::vector<Tensor>&) {
    add_cost(costs, s.graph, n, runs);
    const Clock::time_point now = Clock::now();
    auto& [ms, count] = per_op[n.op->name];
    ms += std::chrono::duration<double, std::milli>(now - last).count() / runs;
    count += 1;
    last = now;
  };
  for (int r = 0; r < runs; ++r) {
    last = Clock::now();
    exec.run(s.feeds, {s.loss}, s.updates);
  }
  print_profile(per_op, runs, "on the host", costs, peaks);
}

}  // namespace

// Where one step's GPU time goes, per op: a CUDA event after every node of `runs` executor
// runs (the executor enqueues ahead of the GPU, so the gaps between events are kernel time),
// summed per op and printed largest first.
// With `node_ops` (comma-separated op names), also lists each node of those ops with its
// first input's type: which of a model's many fake-quantizers cost what.
void profile_step(StepGraph& s, Device device, const ContextOptions& context, int runs,
                  const std::string& node_ops, const DevicePeaks* peaks) {
  if (device.is_cpu()) {
    profile_step_cpu(s, device, runs, peaks);
    return;
  }
#ifdef QG_WITH_CUDA
  Executor::Feeds feeds;
  for (auto& [name, t] : s.feeds) feeds[name] = t.to(device);
  Executor exec(s.graph, device, context);
  exec.run(feeds, {s.loss}, s.updates);  // warm-up: allocator, library handles
  auto stream = static_cast<cudaStream_t>(exec.stream());
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  std::vector<std::string> labels;  // per mark: "op node [input type]" when listed, else ""
  const std::string listed = "," + node_ops + ",";
  std::map<std::string, NodeCost> costs;
  exec.on_node = [&](const Node& n, const std::vector<Tensor>&) {
    add_cost(costs, s.graph, n, runs);
    cudaEvent_t e;
    QG_CUDA_CHECK("steps", cudaEventCreate(&e));
    QG_CUDA_CHECK("steps", cudaEventRecord(e, stream));
    marks.push_back({n.op->name, e});
    std::string label;
    if (listed.find("," + n.op->name + ",") != std::string::npos)
      label = n.op->name + " " + n.name +
              (n.inputs.empty() ? "" : " " + s.graph.value(n.inputs[0]).type.str());
    labels.push_back(label);
  };
  for (int r = 0; r < runs; ++r) exec.run(feeds, {s.loss}, s.updates);
  QG_CUDA_CHECK("steps", cudaStreamSynchronize(stream));
  std::map<std::string, std::pair<double, int>> per_op, per_node;
  for (size_t i = 1; i < marks.size(); ++i) {
    float ms = 0;
    QG_CUDA_CHECK("steps", cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
    auto& [t, count] = per_op[marks[i].first];
    t += ms / runs;
    count += 1;
    if (!labels[i].empty()) {
      auto& [tn, cn] = per_node[labels[i]];
      tn += ms / runs;
      cn += 1;
    }
  }
  for (auto& m : marks) cudaEventDestroy(m.second);
  print_profile(per_op, runs, "between the first and last node", costs, peaks);
  for (const auto& [label, t] : per_node)
    std::printf("    node %-60s %8.4f ms\n", label.c_str(), t.first);
#else
  (void)s, (void)device, (void)context, (void)runs, (void)node_ops, (void)peaks;
#endif
}

}  // namespace qg::cli
