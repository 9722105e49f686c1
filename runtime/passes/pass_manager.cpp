#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/op_registry.h"
#include "runtime/passes/merge_duplicates.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

// The default pipeline: every fusion rule an op registers, in the order it runs, and why.
struct PassStep {
  const char* name;
  const char* why_here;
};
constexpr PassStep kPassOrder[] = {
    {"fuse_observer_quantize",
     "first: fuse_activation_prologue extends the fused_observe_quantize nodes it makes"},
    {"fuse_ste_backward",
     "before the other ste_backward fusions: an ste_backward feeding an activation backward "
     "saves more there"},
    {"fuse_ste_optimizer",
     "before fuse_ste_chain: an ste_backward -> ste_backward -> step chain then saves the "
     "weight gradient's round trip"},
    {"fuse_ste_chain", "after fuse_ste_optimizer (above)"},
    {"fuse_ste_producer",
     "after the rules that fuse an ste_backward into its reader: where both apply, each saves "
     "one round trip of the masked gradient, and the readers' fusions came first, so graphs "
     "they fuse keep their fusions"},
    {"fuse_ste_mul_pair",
     "after the rules that fuse an ste_backward with one reader (above): it takes those whose "
     "masked gradient has two readers, both muls, which none of them takes"},
    {"fuse_channel_div_batch_norm",
     "no other rule reads channel_div, batch_norm or their backward ops"},
    {"fuse_activation_prologue",
     "after fuse_observer_quantize: moves an activation into the fused node that pass made"},
    {"fuse_scaled_softmax",
     "no other rule fuses softmax or softmax_backward; fuse_ste_mul_pair's muls read a masked "
     "gradient, which a softmax's scaling mul never does"},
    {"fuse_swiglu",
     "after fuse_ste_mul_pair, which takes the backward muls of a SwiGLU whose dh is a masked "
     "gradient (QAT): it saves that gradient's round trip; this rule takes the float ones"},
    {"fuse_cast_add",
     "after fuse_ste_producer, which also takes adds (one feeding an ste_backward): that "
     "fusion saves the masked gradient's round trip; this one takes the widening casts of "
     "the adds left"},
    {"fuse_norm_backward_add",
     "after fuse_ste_producer and fuse_cast_add, which take adds too: an add they fused is "
     "no longer there to join an rms_norm_backward"},
    {"fuse_norm_cast",
     "independent of the others: it rewrites an f32 rms_norm and the narrowing cast of its y, "
     "which no other rule reads"},
    {"fuse_grad_cast",
     "after fuse_ste_optimizer, which takes an ste_backward -> step pair: the gradient a step "
     "reads there is the masked one; this rule takes the steps that read a widened gradient"},
    {"fuse_cast_ste",
     "after the rules that fuse an ste_backward with its reader (fuse_ste_optimizer, "
     "fuse_ste_chain, fuse_ste_producer, fuse_ste_mul_pair): they save more"},
    {"fuse_dfq_cast",
     "independent of the others: it rewrites a forward dynamic_fake_quantize and the cast of "
     "its y, which no other rule reads"},
    {"fuse_multi_tensor_cast",
     "after fuse_dfq_cast, which takes a quantized weight's cast into its fake-quant: the casts "
     "left that read a parameter (the unquantized weights' compute copies) become one node"},
    {"fuse_multi_tensor_adam",
     "last with fuse_multi_tensor_adamw: it merges whole groups of adam steps, after "
     "fuse_grad_cast and fuse_ste_optimizer rewrote the steps they take"},
    {"fuse_multi_tensor_adamw",
     "last: it merges whole groups of adamw steps, which no other rule reads; after the rules "
     "that rewrite a step into another fused node, should one take adamw"},
};

const FusionRule& registered_rule(const std::string& name) {
  for (const OpDef* op : OpRegistry::instance().all())
    for (const FusionRule& rule : op->fusion_rules)
      if (rule.name == name) return rule;
  QG_FAIL("passes", "no op registers the fusion rule '", name, "' named in the pass order");
}

}  // namespace

PassOptions PassOptions::from_env(PassOptions base) {
  const char* env = std::getenv("QG_DISABLE_PASSES");
  if (env == nullptr) return base;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) base.disabled.insert(item);
  return base;
}

int run_fusion_rule(const FusionRule& rule, Graph& g) {
  // 1. Match and 2. judge every candidate on the graph as it is before any rewrite.
  std::vector<FusionCandidate> accepted;
  for (NodeId id : g.topological_order())
    for (FusionCandidate& c : rule.match(g, id))
      if (rule.legal(g, c).empty()) accepted.push_back(std::move(c));
  std::stable_sort(
      accepted.begin(), accepted.end(),
      [](const FusionCandidate& a, const FusionCandidate& b) { return a.form < b.form; });
  // 3. Build, in that order, each candidate that shares no node with one built before it.
  std::vector<bool> taken(static_cast<size_t>(g.num_nodes()), false);
  int rewrites = 0;
  for (const FusionCandidate& c : accepted) {
    const bool free =
        std::none_of(c.nodes.begin(), c.nodes.end(), [&](NodeId n) { return n >= 0 && taken[n]; });
    if (!free) continue;
    for (NodeId n : c.nodes)
      if (n >= 0) taken[n] = true;
    rule.build(g, c);
    ++rewrites;
  }
  return rewrites;
}

std::vector<std::string> default_pass_names() {
  std::vector<std::string> names = {kMergeDuplicates};
  for (const PassStep& step : kPassOrder) names.push_back(step.name);
  return names;
}

std::vector<PassRecord> optimize(Graph& graph, const PassOptions& options) {
  std::vector<PassRecord> records;
  // First: the fusion rules then see one node where the model built several equal ones.
  PassRecord merge{kMergeDuplicates, options.enabled(kMergeDuplicates), 0};
  if (merge.ran) merge.rewrites = merge_duplicate_nodes(graph);
  records.push_back(merge);
  for (const PassStep& step : kPassOrder) {
    PassRecord r{step.name, options.enabled(step.name), 0};
    if (r.ran) r.rewrites = run_fusion_rule(registered_rule(step.name), graph);
    records.push_back(r);
  }
  graph.validate();
  return records;
}

}  // namespace qg
