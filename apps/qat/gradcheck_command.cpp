// `qat gradcheck`: the gradient check of every registered differentiable op, as a table.
// Exits non-zero on any failure.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "apps/qat/commands.h"
#include "core/op_registry.h"
#include "runtime/gradcheck.h"

namespace qg::cli {

void add_gradcheck_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("gradcheck", "Gradient-check every differentiable op (f64)");
  auto op_filter = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(1234);
  cmd->add_option("--op", *op_filter, "Check only this op");
  cmd->add_option("--seed", *seed, "Random seed for the inputs");
  cmd->callback([op_filter, seed] {
    std::vector<GradcheckResult> results;
    if (op_filter->empty()) {
      results = gradcheck_all(*seed);
    } else {
      const OpDef& op = OpRegistry::instance().get(*op_filter);
      if (!op.is_differentiable()) {
        std::cerr << "op '" << *op_filter << "' is not differentiable\n";
        std::exit(2);
      }
      for (const auto& s : op.gradcheck_samples()) results.push_back(gradcheck(op, s, *seed));
    }
    std::printf("%-30s %-28s %-5s %-15s %-12s %-9s %s\n", "op", "sample", "dtype", "method",
                "max rel err", "tolerance", "result");
    int failed = 0;
    for (const auto& r : results) {
      std::printf("%-30s %-28s %-5s %-15s %-12.3e %-9.0e %s\n", r.op.c_str(), r.sample.c_str(),
                  r.dtype.c_str(), r.method.c_str(), r.max_rel_error, r.tolerance,
                  r.passed ? "pass" : "FAIL");
      if (!r.error.empty()) std::printf("    error: %s\n", r.error.c_str());
      failed += r.passed ? 0 : 1;
    }
    std::printf("%zu checks: %zu passed, %d failed\n", results.size(), results.size() - failed,
                failed);
    if (failed) std::exit(1);
  });
}

}  // namespace qg::cli
