#include "runtime/distributed/optimizer_sharding.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/graph.h"

namespace qg::dist {

ShardPlan plan_optimizer_shards(const std::vector<int64_t>& numels, int ranks) {
  QG_CHECK(ranks >= 1, "zero1", "ranks = ", ranks);
  QG_CHECK(static_cast<int64_t>(numels.size()) >= ranks, "zero1", numels.size(),
           " parameters cannot give each of ", ranks, " ranks one to update");
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  ShardPlan plan;
  plan.owner.assign(numels.size(), 0);
  std::vector<int64_t> load(ranks, 0);
  std::vector<int> owned(ranks, 0);
  for (size_t i : order) {
    // Least loaded first; among equal loads, a rank that owns nothing yet, then the lower rank.
    int best = 0;
    for (int r = 1; r < ranks; ++r) {
      const bool empty_first = (owned[r] == 0) != (owned[best] == 0);
      if (empty_first ? owned[r] == 0 : load[r] < load[best]) best = r;
    }
    plan.owner[i] = best;
    load[best] += numels[i];
    ++owned[best];
  }
  // Offsets in parameter order within each shard, so a shard's layout reads like the model.
  plan.offset.assign(numels.size(), 0);
  std::vector<int64_t> next(ranks, 0);
  for (size_t i = 0; i < numels.size(); ++i) {
    plan.offset[i] = next[plan.owner[i]];
    next[plan.owner[i]] += numels[i];
  }
  plan.shard_elements = std::max<int64_t>(*std::max_element(next.begin(), next.end()), 1);
  return plan;
}

OptimizerNodes shard_optimizer_states(OptimizerNodes inner, int rank, int ranks) {
  QG_CHECK(static_cast<bool>(inner), "zero1", "no optimizer to shard");
  QG_CHECK(rank >= 0 && rank < ranks, "zero1", "rank ", rank, " of ", ranks);
  return [inner, rank, ranks](Graph& g, const std::vector<ValueId>& params,
                              const std::vector<ValueId>& grads) {
    QG_CHECK(params.size() == grads.size(), "zero1", params.size(), " parameters but ",
             grads.size(), " gradients");
    QG_CHECK(!params.empty(), "zero1", "no parameters");
    const DType dtype = g.value(params[0]).type.dtype;
    std::vector<int64_t> numels;
    for (ValueId p : params) {
      const TensorType& t = g.value(p).type;
      QG_CHECK(t.dtype == dtype, "zero1", "parameters of one dtype only: '", g.value(p).name,
               "' is ", dtype_name(t.dtype), ", '", g.value(params[0]).name, "' is ",
               dtype_name(dtype));
      numels.push_back(t.numel());
    }
    const ShardPlan plan = plan_optimizer_shards(numels, ranks);
    // Every parameter's readers as the graph stands: a parameter another rank updates is
    // overwritten only after all of them.
    std::vector<std::vector<NodeId>> readers;
    for (ValueId p : params) readers.push_back(g.consumers(p));
    // 1. the optimizer steps of this rank's parameters: their state exists here alone.
    std::vector<ValueId> mine, my_grads;
    for (size_t i = 0; i < params.size(); ++i)
      if (plan.owner[i] == rank) {
        mine.push_back(params[i]);
        my_grads.push_back(grads[i]);
      }
    std::vector<NodeId> steps = inner(g, mine, my_grads);
    QG_CHECK(steps.size() == mine.size(), "zero1", "the optimizer made ", steps.size(),
             " step nodes for ", mine.size(), " parameters (one each, in order, is expected)");
    // 2. this rank's updated parameters packed into its shard, after their steps.
    ValueId shard = kNoValue;
    for (size_t i = 0, k = 0; i < params.size(); ++i) {
      if (plan.owner[i] != rank) continue;
      const int64_t offset = plan.offset[i];
      shard = shard == kNoValue ? g.apply1("bucket_begin", {params[i]},
                                           {{"size", plan.shard_elements}, {"offset", offset}})
                                : g.apply1("bucket_put", {shard, params[i]}, {{"offset", offset}});
      g.add_control_dependency(steps.at(k++), g.value(shard).producer);
    }
    g.set_name(shard, "zero1.shard");
    // 3. every rank's shard, then the parameters of the other ranks copied out of it.
    const ValueId all = g.apply1("all_gather", {shard}, {{"ranks", int64_t{ranks}}});
    g.set_name(all, "zero1.parameters");
    for (size_t i = 0; i < params.size(); ++i) {
      if (plan.owner[i] == rank) continue;
      g.apply("bucket_assign", {params[i], all},
              {{"offset", plan.owner[i] * plan.shard_elements + plan.offset[i]}},
              g.value(params[i]).name + ".zero1_assign");
      const NodeId assign = g.num_nodes() - 1;  // no outputs: the newest vertex (vecS storage)
      for (NodeId r : readers[i]) g.add_control_dependency(r, assign);
      steps.push_back(assign);
    }
    return steps;
  };
}

}  // namespace qg::dist
