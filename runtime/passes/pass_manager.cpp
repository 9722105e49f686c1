#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "runtime/passes/fuse_activation_prologue.h"
#include "runtime/passes/fuse_channel_div_batch_norm.h"
#include "runtime/passes/fuse_observer_quantize.h"
#include "runtime/passes/fuse_scaled_softmax.h"
#include "runtime/passes/fuse_ste_backward.h"
#include "runtime/passes/fuse_ste_optimizer.h"
#include "runtime/passes/fuse_ste_producer.h"
#include "runtime/passes/pass.h"

namespace qg {

PassOptions PassOptions::from_env(PassOptions base) {
  const char* env = std::getenv("QG_DISABLE_PASSES");
  if (env == nullptr) return base;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) base.disabled.insert(item);
  return base;
}

void replace_all_uses(Graph& g, ValueId old, ValueId now) {
  for (NodeId reader : g.consumers(old)) {
    const size_t slots = g.node(reader).inputs.size();
    for (size_t slot = 0; slot < slots; ++slot)
      if (g.node(reader).inputs[slot] == old) g.replace_input(reader, static_cast<int>(slot), now);
  }
}

NodeId live_node(const Graph& g, NodeId node) {
  if (!g.node(node).dead) return node;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.dead) continue;
    for (const Node& original : n.fused_from)
      if (original.id == node) return id;
  }
  QG_FAIL("passes", "node ", node, " ('", g.node(node).name,
          "') was removed and no live fused node took it in");
}

NodeId replace_with_fused_node(Graph& g, Node fused, const std::vector<ValueId>& replaced,
                               const std::vector<NodeId>& originals,
                               std::vector<TensorType> types) {
  if (types.empty())
    for (ValueId v : replaced) types.push_back(g.value(v).type);
  const NodeId f = g.add_raw_node(std::move(fused), types);
  const std::vector<ValueId> outs = g.node(f).outputs;
  std::vector<std::string> names;
  std::vector<bool> marked;
  for (size_t i = 0; i < replaced.size(); ++i) {
    replace_all_uses(g, replaced[i], outs[i]);
    names.push_back(g.value(replaced[i]).name);
    marked.push_back(g.is_output(replaced[i]));
  }
  for (NodeId n : originals) g.remove_node(n);  // frees the names for the new outputs
  for (size_t i = 0; i < replaced.size(); ++i) {
    if (!names[i].empty()) g.set_name(outs[i], names[i]);
    if (marked[i]) g.mark_output(outs[i]);
  }
  return f;
}

std::vector<std::unique_ptr<Pass>> default_passes() {
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(std::make_unique<FuseObserverQuantizePass>());
  passes.push_back(std::make_unique<FuseSteBackwardPass>());
  passes.push_back(std::make_unique<FuseSteOptimizerPass>());
  passes.push_back(std::make_unique<FuseSteChainPass>());
  passes.push_back(std::make_unique<FuseSteProducerPass>());
  passes.push_back(std::make_unique<FuseChannelDivBatchNormPass>());
  passes.push_back(std::make_unique<FuseActivationProloguePass>());
  passes.push_back(std::make_unique<FuseScaledSoftmaxPass>());
  return passes;
}

std::vector<std::string> default_pass_names() {
  std::vector<std::string> names;
  for (const auto& p : default_passes()) names.push_back(p->name());
  return names;
}

std::vector<PassRecord> optimize(Graph& graph, const PassOptions& options) {
  std::vector<PassRecord> records;
  for (const auto& pass : default_passes()) {
    PassRecord r{pass->name(), options.enabled(pass->name()), 0};
    if (r.ran) r.rewrites = pass->run(graph);
    records.push_back(r);
  }
  graph.validate();
  return records;
}

}  // namespace qg
