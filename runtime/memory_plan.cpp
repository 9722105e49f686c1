#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace qg {

const PlannedBuffer* MemoryPlan::find(ValueId v) const {
  if (v < 0 || v >= static_cast<ValueId>(buffer_of.size()) || buffer_of[v] < 0) return nullptr;
  return &buffers[buffer_of[v]];
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else if (bytes < (int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::vector<NodeId> needed_order(const Graph& graph, const std::vector<ValueId>& fetches,
                                 const std::vector<NodeId>& targets) {
  std::vector<bool> needed = graph.needed_nodes(fetches, targets);
  std::vector<NodeId> order;
  for (NodeId id : graph.topological_order())
    if (needed[id]) order.push_back(id);
  return order;
}

namespace {

int64_t aligned(int64_t bytes) {
  return (bytes + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
}

// Best fit among the gaps left by the buffers live at `first`; the top of the highest live
// buffer when no gap fits.
int64_t place(const std::vector<PlannedBuffer>& placed, int first, int64_t size) {
  std::vector<std::pair<int64_t, int64_t>> live;  // [offset, end) of buffers live at `first`
  for (const PlannedBuffer& b : placed)
    if (b.last >= first) live.push_back({b.offset, b.offset + aligned(b.bytes)});
  std::sort(live.begin(), live.end());
  int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
  int64_t cursor = 0;
  for (const auto& [start, end] : live) {
    int64_t gap = start - cursor;
    if (gap >= size && gap < best_gap) {
      best = cursor;
      best_gap = gap;
    }
    cursor = std::max(cursor, end);
  }
  return best >= 0 ? best : cursor;
}

}  // namespace

MemoryPlan plan_memory(const Graph& graph, const std::vector<NodeId>& order,
                       const std::vector<ValueId>& fetches) {
  MemoryPlan plan;
  plan.order = order;
  const int nv = graph.num_values();
  const int end = static_cast<int>(order.size());
  plan.buffer_of.assign(nv, -1);
  plan.alias_root.resize(nv);
  for (int v = 0; v < nv; ++v) plan.alias_root[v] = v;

  // Views resolve to the value they view (chains of reshapes end at one root).
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    if (n.op->aliases_input) {
      QG_CHECK(!n.inputs.empty() && n.outputs.size() == 1, "memory_plan", "op '", n.op->name,
               "' is marked aliases_input but does not map one input to one output");
      plan.alias_root[n.outputs[0]] = plan.alias_root[n.inputs[0]];
    }
  }

  // Last use of each root: its own readers and the readers of every view of it.
  std::vector<int> first(nv, -1), last(nv, -1);
  for (int p = 0; p < end; ++p) {
    const Node& n = graph.node(order[p]);
    for (ValueId out : n.outputs) first[out] = p;
    for (ValueId in : n.inputs) {
      ValueId root = plan.alias_root[in];
      last[root] = std::max(last[root], p);
    }
  }
  for (ValueId f : fetches) last[plan.alias_root[f]] = end;

  for (int p = 0; p < end; ++p) {
    const Node& n = graph.node(order[p]);
    if (n.op->is_source || n.op->aliases_input) continue;
    for (ValueId out : n.outputs) {
      PlannedBuffer b;
      b.value = out;
      b.bytes = graph.value(out).type.numel() *
                static_cast<int64_t>(dtype_size(graph.value(out).type.dtype));
      b.first = p;
      // An output nobody reads is still written by its kernel: live at its own position.
      b.last = std::max(last[out], p);
      b.offset = b.bytes == 0 ? 0 : place(plan.buffers, p, aligned(b.bytes));
      plan.buffer_of[out] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back(b);
      plan.naive_bytes += aligned(b.bytes);
      plan.arena_bytes = std::max(plan.arena_bytes, b.offset + aligned(b.bytes));
    }
  }
  return plan;
}

}  // namespace qg
