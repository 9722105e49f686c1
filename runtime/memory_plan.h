// Liveness-based memory planning. For one run of a graph (the nodes that the fetches and
// targets need, in launch order) every value a kernel writes gets a byte range in one arena;
// a value whose last reader has run gives its bytes to values defined later. StaticRun
// allocates the arena once and hands each node output a view at its offset, so addresses are
// fixed from launch to launch (what a captured CUDA graph needs) and the peak is the arena.
//
// Not planned: values of source nodes (inputs, constants, parameters: they are fed or are
// node state) and values of ops that hand out a view of their input (OpDef::aliases_input:
// reshape, stop_gradient). A view keeps the buffer it views alive as long as it is read.
// Fetched values live to the end of the run.
#pragma once

#include <string>
#include <vector>

#include "core/graph.h"

namespace qg {

// Every planned buffer starts on a 512-byte boundary, so 16-byte vector loads stay aligned
// whatever the dtype and size of the values before it (the CUDA allocator's granularity).
inline constexpr int64_t kPlanAlignment = 512;

struct PlannedBuffer {
  ValueId value = kNoValue;
  int64_t offset = 0;  // bytes into the arena
  int64_t bytes = 0;   // the value's size, before alignment
  int first = 0;       // launch position of the producer
  int last = 0;        // last launch position that reads it (or a view of it); end = fetched
  int inside = -1;     // index of the buffer it is placed in (a gradient in its bucket), or -1
};

struct MemoryPlan {
  std::vector<NodeId> order;           // the nodes run, in launch order (sources included)
  std::vector<PlannedBuffer> buffers;  // one per planned value, in order of definition
  std::vector<int> buffer_of;          // per ValueId: index into buffers, or -1
  std::vector<ValueId> alias_root;     // per ValueId: the value whose bytes it views, or itself
  int64_t arena_bytes = 0;             // peak: the arena's size
  int64_t naive_bytes = 0;             // every planned value in its own (aligned) buffer
  int num_buffers() const { return static_cast<int>(buffers.size()); }
  const PlannedBuffer* find(ValueId v) const;  // nullptr for values without a buffer
};

// The nodes that `fetches` and `targets` need, in topological order.
std::vector<NodeId> needed_order(const Graph& graph, const std::vector<ValueId>& fetches,
                                 const std::vector<NodeId>& targets = {});

// Plans the run of `order` (as needed_order returns it). Best fit: each value, in order of
// definition, takes the smallest gap between buffers still live at its definition that fits
// it, or goes on top of the highest live buffer. A node's outputs never share bytes with its
// inputs or with each other (both are live at the node's position).
//
// One exception, DDP's gradient_as_bucket_view: a value whose only reader is the bucket_begin
// or bucket_put that copies it into a gradient bucket (runtime/distributed/gradient_sync.h), at
// a 512-byte-aligned offset, is placed in the bucket itself at that offset (its buffer's
// `inside`), so its producer writes it where the all-reduce reads it and the copy finds source
// and destination equal (a no-op). The bucket's buffer is then live from its first such
// member's definition on; a member shares bytes only with the bucket that holds it.
MemoryPlan plan_memory(const Graph& graph, const std::vector<NodeId>& order,
                       const std::vector<ValueId>& fetches);

std::string format_bytes(int64_t bytes);  // "512 B", "3.0 KiB", "1.50 MiB"

}  // namespace qg
