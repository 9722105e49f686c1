// Graph passes. Each pass has a name and can be switched off on its own, by option or by
// the environment (QG_DISABLE_PASSES=name1,name2 or =all), so the same graph can run fused
// and unfused.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/graph.h"

namespace qg {

struct PassOptions {
  std::set<std::string> disabled;  // pass names, or "all"
  bool enabled(const std::string& pass) const {
    return disabled.count(pass) == 0 && disabled.count("all") == 0;
  }
  // Reads QG_DISABLE_PASSES (comma-separated) on top of `base`.
  static PassOptions from_env(PassOptions base = {});
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  // Rewrites the graph; returns how many rewrites it made.
  virtual int run(Graph& graph) = 0;
};

struct PassRecord {
  std::string name;
  bool ran = false;
  int rewrites = 0;
};

// Points every input slot that reads `old` at `now` instead (a fusion pass's rewiring of the
// readers of a value it replaces).
void replace_all_uses(Graph& graph, ValueId old, ValueId now);

// A fusion pass's rewrite: adds `fused` with outputs of `types` (default: the types of
// `replaced`), points the readers of replaced[i] at the fused node's output i, removes
// `originals` in the given order (readers before producers), and gives output i the name and
// output mark replaced[i] had. Returns the fused node's id.
NodeId replace_with_fused_node(Graph& graph, Node fused, const std::vector<ValueId>& replaced,
                               const std::vector<NodeId>& originals,
                               std::vector<TensorType> types = {});

// `node` itself while it is live; once a fusion pass removed it, the live fused node that
// took it in (whose fused_from holds it), so code that kept a NodeId from graph building
// (nn's ConvBnLayer::bn_node) still reaches the node holding its states. Throws when none.
NodeId live_node(const Graph& graph, NodeId node);

// The default pipeline, in order: fuse_observer_quantize, fuse_ste_backward,
// fuse_ste_optimizer, fuse_ste_chain, fuse_ste_producer, fuse_channel_div_batch_norm,
// fuse_activation_prologue, fuse_scaled_softmax.
// (fuse_ste_backward first: an ste_backward feeding an activation backward saves more there;
// fuse_ste_optimizer before fuse_ste_chain: an ste_backward -> ste_backward -> step chain
// then saves the weight gradient's round trip; fuse_ste_producer after the passes that fuse
// an ste_backward into its reader: where both apply, each saves one round trip of the masked
// gradient, and the readers' fusions came first, so graphs they fuse keep their fusions;
// fuse_scaled_softmax last: no other pass fuses mul, softmax or softmax_backward.)
std::vector<std::unique_ptr<Pass>> default_passes();
std::vector<std::string> default_pass_names();

// Runs the default pipeline on `graph` under `options` (environment included).
std::vector<PassRecord> optimize(Graph& graph,
                                 const PassOptions& options = PassOptions::from_env());

}  // namespace qg
