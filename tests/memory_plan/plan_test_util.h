// Helpers shared by the memory-planner and CUDA-graph tests: the planner's invariants, and
// the state of a QAT training step (fetched loss, parameters, observer and optimizer state)
// copied to the host so runs can be compared bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench/harness/qat_step.h"
#include "runtime/executor.h"
#include "runtime/memory_plan.h"
#include "runtime/passes/pass.h"

namespace qg::testing {

// Every pair of buffers live at the same position occupies disjoint bytes; every buffer is
// aligned and inside the arena; naive is the sum of the aligned sizes.
inline void expect_plan_invariants(const MemoryPlan& plan) {
  int64_t naive = 0;
  for (const PlannedBuffer& b : plan.buffers) {
    int64_t size = (b.bytes + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
    if (b.inside >= 0) {  // a gradient in its bucket: within the bucket's bytes and lifetime
      const PlannedBuffer& holder = plan.buffers.at(static_cast<size_t>(b.inside));
      EXPECT_GE(b.offset, holder.offset) << "value " << b.value;
      EXPECT_LE(b.offset + b.bytes, holder.offset + holder.bytes) << "value " << b.value;
      EXPECT_GE(b.first, holder.first) << "value " << b.value;
      EXPECT_LE(b.last, holder.last) << "value " << b.value;
      size = 0;  // no bytes of its own
    }
    naive += size;
    EXPECT_EQ(b.offset % kPlanAlignment, 0) << "value " << b.value;
    EXPECT_LE(b.offset + size, plan.arena_bytes) << "value " << b.value;
    EXPECT_LE(b.first, b.last) << "value " << b.value;
  }
  EXPECT_EQ(naive, plan.naive_bytes);
  EXPECT_LE(plan.arena_bytes, plan.naive_bytes);
  for (size_t i = 0; i < plan.buffers.size(); ++i)
    for (size_t j = i + 1; j < plan.buffers.size(); ++j) {
      const PlannedBuffer& a = plan.buffers[i];
      const PlannedBuffer& b = plan.buffers[j];
      if (a.bytes == 0 || b.bytes == 0) continue;
      // A bucket and a gradient placed in it share bytes by design.
      if (b.inside == static_cast<int>(i) || a.inside == static_cast<int>(j)) continue;
      bool live_together = a.first <= b.last && b.first <= a.last;
      bool bytes_overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      EXPECT_FALSE(live_together && bytes_overlap)
          << "values " << a.value << " [" << a.first << "," << a.last << "] @" << a.offset << "+"
          << a.bytes << " and " << b.value << " [" << b.first << "," << b.last << "] @" << b.offset
          << "+" << b.bytes << " are live together and share bytes";
    }
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  if (ha.dtype() != hb.dtype() || ha.shape() != hb.shape()) return false;
  return ha.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// The QAT step graph with fetches and targets, fused or not.
struct QatStepGraph {
  static constexpr int64_t kBatch = 32, kIn = 48, kHidden = 64, kClasses = 10;
  Graph graph;
  bench::QatStep step;
  std::vector<ValueId> fetches;  // loss and every gradient (by name: ids survive the pass)

  explicit QatStepGraph(bool fused) {
    step = bench::build_qat_step(graph, kBatch, kIn, kHidden, kClasses);
    for (size_t i = 0; i < step.grads.size(); ++i)
      graph.set_name(step.grads[i], "grad" + std::to_string(i));
    optimize(graph, fused ? PassOptions{} : PassOptions{{"all"}});
    fetches = {graph.at("loss")};
    for (size_t i = 0; i < step.grads.size(); ++i)
      fetches.push_back(graph.at("grad" + std::to_string(i)));
  }
  Executor::Feeds feeds(int k, Device device) const {
    return {{"x", bench::qat_step_x(kBatch, kIn, k).to(device)},
            {"labels", bench::qat_step_labels(kBatch, kClasses, k).to(device)}};
  }
};

// Every persistent tensor of the executor (parameters, observer and optimizer state), in
// node order, on the host.
inline std::vector<Tensor> all_state(Executor& exec) {
  std::vector<Tensor> out;
  const Graph& g = exec.graph();
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    if (g.node(id).dead) continue;
    for (const Tensor& t : exec.states(id)) out.push_back(t.to(Device::cpu()));
  }
  return out;
}

inline void expect_same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same_bytes(a[i], b[i])) << what << " #" << i << ": " << a[i].str();
}

}  // namespace qg::testing
