// The op registry. Op families register themselves, with the kernels of every backend,
// through the one table in ops/op_table.cpp; the start-up self-check fails loudly when a
// differentiable op has no backward rule or gradient-check sample, an op has no CPU
// reference kernel, or (in a CUDA build) a CUDA kernel is missing.
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
  bool supports(const std::string& op, DeviceType device,
                const std::vector<DType>& input_dtypes) const;

  // Throws qg::Error listing every problem found. In a CUDA build it also requires CUDA
  // coverage (see the overload).
  void self_check() const;
  // With `require_cuda_kernels`, an op with a CPU kernel must have a CUDA kernel unless it is
  // declared cpu_only, and its CUDA kernels must accept at each input position the dtypes its
  // CPU kernels accept there, except its cpu_only_dtypes.
  void self_check(bool require_cuda_kernels) const;

  // Wraps every CUDA kernel of a non-source op in a device check, so a tensor on the wrong
  // device (or inputs spread over several devices) is a qg::Error naming the op, never a
  // kernel dereferencing host memory. Called once, after every family has registered.
  void add_cuda_device_checks();

 private:
  std::map<std::string, std::unique_ptr<OpDef>> ops_;
};

// Where the op's CUDA kernels accept fewer dtypes than its CPU kernels, input position by
// position ("x: f16, bf16"); empty when there is no gap. The op's cpu_only_dtypes are left
// out unless `include_declared`.
std::string cuda_dtype_gaps(const OpDef& op, bool include_declared = false);

// Validates `given` against the op's schema: unknown attributes, wrong types and invalid
// values throw; defaults are filled in. Returns the complete attribute set.
Attrs resolve_attrs(const OpDef& op, const Attrs& given);

// Defined in ops/op_table.cpp: registers every op family (each adds its CUDA kernels when
// built with CUDA).
void register_all_ops(OpRegistry& registry);

}  // namespace qg
