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

// A value to place inside a gradient bucket (plan_memory's exception, memory_plan.h).
struct BucketMember {
  ValueId value;        // the member's root: the value its producer writes
  ValueId bucket;       // the bucket's root (bucket_begin's output)
  int64_t byte_offset;  // where the member starts in the bucket
};

// The members: the input that bucket_begin (input 0) or bucket_put (input 1) copies into the
// bucket, when that input views all the bytes of a planned root that nothing else reads and
// nobody fetches, at an offset on the plan's alignment.
std::vector<BucketMember> bucket_members(const Graph& graph, const std::vector<NodeId>& order,
                                         const std::vector<ValueId>& alias_root,
                                         const std::vector<ValueId>& fetches) {
  const int nv = graph.num_values();
  // Per root: the nodes that read it other than as the viewed input of a view op.
  std::vector<int> readers(nv, 0);
  std::vector<bool> planned_root(nv, false);
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    for (size_t s = n.op->aliases_input ? 1 : 0; s < n.inputs.size(); ++s)
      ++readers[alias_root[n.inputs[s]]];
    if (!n.op->is_source && !n.op->aliases_input)
      for (ValueId out : n.outputs) planned_root[out] = true;
  }
  for (ValueId f : fetches) readers[alias_root[f]] += 2;  // a fetch is a reader too
  std::vector<BucketMember> members;
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    const bool begin = n.op->name == "bucket_begin", put = n.op->name == "bucket_put";
    if (!begin && !put) continue;
    const ValueId x = n.inputs[begin ? 0 : 1];
    const ValueId root = alias_root[x], bucket = alias_root[n.outputs[0]];
    const TensorType& t = graph.value(x).type;
    const int64_t offset = n.attrs.get_int("offset") * static_cast<int64_t>(dtype_size(t.dtype));
    const TensorType& rt = graph.value(root).type;
    const bool whole = rt.dtype == t.dtype && rt.numel() == t.numel();
    if (planned_root[root] && planned_root[bucket] && root != bucket && whole &&
        readers[root] == 1 && offset % kPlanAlignment == 0)
      members.push_back({root, bucket, offset});
  }
  return members;
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

  const std::vector<BucketMember> members = bucket_members(graph, order, plan.alias_root, fetches);
  std::vector<const BucketMember*> member_of(nv, nullptr);
  for (const BucketMember& m : members) member_of[m.value] = &m;

  auto bytes_of = [&](ValueId v) {
    return graph.value(v).type.numel() *
           static_cast<int64_t>(dtype_size(graph.value(v).type.dtype));
  };
  // Places `v`, defined at position p (a bucket: from its first member's definition on).
  auto plan_value = [&](ValueId v, int p) {
    PlannedBuffer b;
    b.value = v;
    b.bytes = bytes_of(v);
    b.first = p;
    // An output nobody reads is still written by its kernel: live at its own position.
    b.last = std::max(last[v], p);
    b.offset = b.bytes == 0 ? 0 : place(plan.buffers, p, aligned(b.bytes));
    plan.buffer_of[v] = static_cast<int>(plan.buffers.size());
    plan.buffers.push_back(b);
    plan.naive_bytes += aligned(b.bytes);
    plan.arena_bytes = std::max(plan.arena_bytes, b.offset + aligned(b.bytes));
  };
  for (int p = 0; p < end; ++p) {
    const Node& n = graph.node(order[p]);
    if (n.op->is_source || n.op->aliases_input) continue;
    for (ValueId out : n.outputs) {
      if (plan.buffer_of[out] >= 0) continue;  // a bucket placed with its first member
      const BucketMember* m = member_of[out];
      if (m == nullptr) {
        plan_value(out, p);
        continue;
      }
      if (plan.buffer_of[m->bucket] < 0) plan_value(m->bucket, p);
      const int holder = plan.buffer_of[m->bucket];
      PlannedBuffer b;
      b.value = out;
      b.bytes = bytes_of(out);
      b.first = p;
      b.last = std::max(last[out], p);
      b.offset = plan.buffers[holder].offset + m->byte_offset;
      b.inside = holder;
      plan.buffer_of[out] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back(b);
    }
  }
  return plan;
}

}  // namespace qg
