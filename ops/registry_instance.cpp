// The process-wide op registry. It lives in the ops layer, beside the op table that fills
// it (ops/op_table.cpp), so that core, which defines the registry, never calls up into ops.
#include <exception>
#include <mutex>

#include "core/op_registry.h"

namespace qg {

OpRegistry& OpRegistry::instance() {
  static OpRegistry registry;
  static std::once_flag once;
  // A failed self-check is raised again on every later call, rather than registering the
  // families a second time into the half-filled registry.
  static std::exception_ptr failure;
  std::call_once(once, [] {
    try {
      register_all_ops(registry);
      registry.add_cuda_device_checks();
      registry.self_check();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);
  return registry;
}

}  // namespace qg
