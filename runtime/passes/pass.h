// The fusion-pass driver. Each pass is a fusion rule that lives with the fused op it makes
// (ops/fused/<op>/, registered on its OpDef); this layer runs them in one ordered table
// (pass_manager.cpp). Each pass has a name and can be switched off on its own, by option or
// by the environment (QG_DISABLE_PASSES=name1,name2 or =all), so the same graph can run fused
// and unfused.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/graph_rewrite.h"  // live_node, for code that kept ids of fused-away nodes

namespace qg {

struct PassOptions {
  std::set<std::string> disabled;  // pass names, or "all"
  bool enabled(const std::string& pass) const {
    return disabled.count(pass) == 0 && disabled.count("all") == 0;
  }
  // Reads QG_DISABLE_PASSES (comma-separated) on top of `base`.
  static PassOptions from_env(PassOptions base = {});
};

struct PassRecord {
  std::string name;
  bool ran = false;
  int rewrites = 0;
};

// The driver's own pass (merge_duplicates.h), which optimize() runs before the fusion rules.
inline constexpr const char* kMergeDuplicates = "merge_duplicate_nodes";

// The default pipeline's pass names, in the order optimize() runs them: kMergeDuplicates,
// then the fusion rules (the table in pass_manager.cpp says why in that order).
std::vector<std::string> default_pass_names();

// Runs one fusion rule over `graph` (match and legal on the graph as it is, then build the
// accepted candidates); returns how many rewrites it made.
int run_fusion_rule(const FusionRule& rule, Graph& graph);

// Runs the default pipeline on `graph` under `options` (environment included).
std::vector<PassRecord> optimize(Graph& graph,
                                 const PassOptions& options = PassOptions::from_env());

}  // namespace qg
