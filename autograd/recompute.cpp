#include "autograd/recompute.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace qg {
namespace {

bool recomputable(const Node& n) {
  return n.states.empty() && !n.op->side_effects && !n.op->is_source && !n.op->overlaps_async;
}

// What rewriting one region did: the backward nodes that now read copies and the copies that
// read no other copy (the ones the control dependencies order).
struct RegionRewrite {
  std::vector<NodeId> readers;
  std::vector<NodeId> roots;
};

class RegionRewriter {
 public:
  RegionRewriter(Graph& g, const RecomputeRegion& r, NodeId backward_begin, NodeId backward_end)
      : g_(g), r_(r), backward_begin_(backward_begin), backward_end_(backward_end) {}

  // 1. classify the region's values, 2. copy the nodes whose outputs the backward reads
  // (and, within the region, what those read), 3. point the backward readers at the copies.
  RegionRewrite run(const GradientMap& value_grads, RecomputeStats& stats) {
    RegionRewrite out;
    std::vector<ValueId> region_outputs;
    std::map<ValueId, std::vector<NodeId>> backward_readers;  // internal value -> readers
    for (NodeId id = r_.begin; id < r_.end; ++id) {
      const Node& n = g_.node(id);
      if (n.dead || n.op->is_source) continue;
      for (ValueId v : n.outputs) {
        bool internal = !g_.is_output(v);
        std::vector<NodeId> readers;
        for (NodeId c : g_.consumers(v)) {
          if (c >= backward_begin_ && c < backward_end_)
            readers.push_back(c);
          else if (!in_region(c))
            internal = false;
        }
        if (!internal)
          region_outputs.push_back(v);
        else if (!readers.empty())
          backward_readers[v] = readers;
      }
    }
    // The copies wait for the gradient of the region's outputs: before it exists the
    // backward has not reached the region.
    std::set<NodeId> anchors;
    for (ValueId v : region_outputs) {
      auto it = value_grads.find(v);
      if (it != value_grads.end()) anchors.insert(g_.value(it->second).producer);
    }
    if (anchors.empty() || backward_readers.empty()) return out;

    // 2. The nodes to copy: producers of the values the backward reads, then (in reverse
    // creation order, so every reader is marked before the nodes it reads) their producers
    // inside the region. Stateful nodes are not copied: their original outputs are read.
    std::vector<bool> copy(static_cast<size_t>(r_.end - r_.begin), false);
    for (const auto& [v, readers] : backward_readers) mark(g_.value(v).producer, copy, stats);
    for (NodeId id = r_.end - 1; id >= r_.begin; --id) {
      if (!copy[static_cast<size_t>(id - r_.begin)]) continue;
      for (ValueId in : g_.node(id).inputs)
        if (internal(in, region_outputs)) mark(g_.value(in).producer, copy, stats);
    }
    std::map<ValueId, ValueId> copy_of;
    for (NodeId id = r_.begin; id < r_.end; ++id) {
      if (!copy[static_cast<size_t>(id - r_.begin)]) continue;
      Node n = g_.node(id);  // a copy: the graph grows below
      bool reads_copy = false;
      for (ValueId& in : n.inputs) {
        auto it = copy_of.find(in);
        if (it == copy_of.end()) continue;
        in = it->second;
        reads_copy = true;
      }
      std::vector<TensorType> types;
      for (ValueId v : n.outputs) types.push_back(g_.value(v).type);
      const std::vector<ValueId> originals = n.outputs;
      n.name += ".recompute";
      const NodeId c = g_.add_raw_node(std::move(n), types);
      for (size_t i = 0; i < originals.size(); ++i) copy_of[originals[i]] = g_.node(c).outputs[i];
      if (!reads_copy) out.roots.push_back(c);
      ++stats.copied_nodes;
    }
    // 3. Point the backward readers at the copies.
    std::set<NodeId> rewired;
    for (const auto& [v, readers] : backward_readers) {
      auto it = copy_of.find(v);
      if (it == copy_of.end()) continue;  // a stateful node's output: read as it is
      for (NodeId reader : readers) {
        const std::vector<ValueId> inputs = g_.node(reader).inputs;
        for (size_t slot = 0; slot < inputs.size(); ++slot)
          if (inputs[slot] == v) g_.replace_input(reader, static_cast<int>(slot), it->second);
        rewired.insert(reader);
      }
    }
    for (NodeId root : out.roots)
      for (NodeId a : anchors) g_.add_control_dependency(a, root);
    out.readers.assign(rewired.begin(), rewired.end());
    ++stats.regions;
    return out;
  }

 private:
  bool in_region(NodeId id) const { return id >= r_.begin && id < r_.end; }

  // Whether `v` is an internal value of the region produced by one of its nodes (as opposed
  // to a region input or a region output, which stay alive and are read as they are).
  bool internal(ValueId v, const std::vector<ValueId>& region_outputs) const {
    const NodeId p = g_.value(v).producer;
    if (!in_region(p) || g_.node(p).op->is_source) return false;
    return std::find(region_outputs.begin(), region_outputs.end(), v) == region_outputs.end();
  }

  void mark(NodeId id, std::vector<bool>& copy, RecomputeStats& stats) {
    const Node& n = g_.node(id);
    if (copy[static_cast<size_t>(id - r_.begin)]) return;
    if (!recomputable(n)) {
      if (kept_.insert(id).second) ++stats.kept_stateful;
      return;
    }
    copy[static_cast<size_t>(id - r_.begin)] = true;
  }

  Graph& g_;
  const RecomputeRegion& r_;
  NodeId backward_begin_, backward_end_;
  std::set<NodeId> kept_;  // stateful nodes counted in RecomputeStats::kept_stateful
};

void check_regions(const Graph& g, const std::vector<RecomputeRegion>& regions,
                   NodeId backward_begin) {
  std::vector<std::pair<NodeId, NodeId>> spans;
  for (const RecomputeRegion& r : regions) {
    QG_CHECK(r.begin >= 0 && r.begin < r.end && r.end <= backward_begin, "recompute", "region '",
             r.name, "' spans nodes [", r.begin, ", ", r.end,
             "), which is empty or not within the forward nodes [0, ", backward_begin, ")");
    spans.push_back({r.begin, r.end});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    QG_CHECK(spans[i].first >= spans[i - 1].second, "recompute", "regions [", spans[i - 1].first,
             ", ", spans[i - 1].second, ") and [", spans[i].first, ", ", spans[i].second,
             ") overlap");
  QG_CHECK(backward_begin <= g.num_nodes(), "recompute", "the backward starts at node ",
           backward_begin, ", the graph has ", g.num_nodes());
}

}  // namespace

RecomputeStats recompute_regions(Graph& g, const std::vector<RecomputeRegion>& regions,
                                 NodeId backward_begin, NodeId backward_end,
                                 const GradientMap& value_grads) {
  check_regions(g, regions, backward_begin);
  QG_CHECK(backward_begin <= backward_end && backward_end <= g.num_nodes(), "recompute",
           "backward nodes [", backward_begin, ", ", backward_end, ") are not within the graph's ",
           g.num_nodes());
  RecomputeStats stats;
  std::vector<RegionRewrite> rewrites;
  for (const RecomputeRegion& r : regions)
    rewrites.push_back(RegionRewriter(g, r, backward_begin, backward_end).run(value_grads, stats));
  // The backward meets the regions in reverse: region i's copies wait until every backward
  // reader of region i + 1's copies has run, so those copies are dead by then. Without this,
  // the order could keep a late reader (a weight gradient) and its copies alive across the
  // recomputation of the regions before it.
  for (size_t i = 0; i + 1 < rewrites.size(); ++i)
    for (NodeId reader : rewrites[i + 1].readers)
      for (NodeId root : rewrites[i].roots) g.add_control_dependency(reader, root);
  try {
    g.validate();
  } catch (const Error& e) {
    QG_FAIL("recompute", "ordering the recomputed regions made the graph invalid: ", e.what());
  }
  return stats;
}

}  // namespace qg
