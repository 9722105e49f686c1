// The process-wide op registry. It lives in the ops layer, beside the op table that fills
// it (ops/op_table.cpp), so that core, which defines the registry, never calls up into ops.
#include <mutex>

#include "core/op_registry.h"

namespace qg {

OpRegistry& OpRegistry::instance() {
  static OpRegistry registry;
  static std::once_flag once;
  std::call_once(once, [] {
    register_all_ops(registry);
    registry.self_check();
  });
  return registry;
}

}  // namespace qg
