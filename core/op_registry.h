// The op registry. Op families register themselves through the one table in
// ops/op_table.cpp; the start-up self-check fails loudly when a differentiable op has no
// backward rule or gradient-check sample, or an op has no CPU reference kernel.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/op_schema.h"

namespace qg {

class OpRegistry {
 public:
  // The process-wide registry, filled from the op table on first use and self-checked.
  // Defined beside the table (ops/registry_instance.cpp): filling it needs the ops layer.
  static OpRegistry& instance();

  OpDef& define(const std::string& name);           // throws when the name is taken
  const OpDef& get(const std::string& name) const;  // throws "unknown op"
  OpDef& get_mutable(const std::string& name);
  const OpDef* find(const std::string& name) const;
  std::vector<const OpDef*> all() const;
  bool supports(const std::string& op, DeviceType device, DType dtype) const;

  // Throws qg::Error listing every problem found.
  void self_check() const;

 private:
  std::map<std::string, std::unique_ptr<OpDef>> ops_;
};

// Validates `given` against the op's schema: unknown attributes, wrong types and invalid
// values throw; defaults are filled in. Returns the complete attribute set.
Attrs resolve_attrs(const OpDef& op, const Attrs& given);

// Defined in ops/op_table.cpp: registers every op family (and CUDA kernels when built).
void register_all_ops(OpRegistry& registry);

}  // namespace qg
