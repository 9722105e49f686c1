// Calling one op's kernel directly: no graph, no executor, no node. The Python bindings'
// run_op, `qat op` and the torch ops call kernels this way.
//
// A PreparedOp does the per-call-site work once: it resolves and validates the attributes,
// infers the output types, finds the kernel for the device and the full input dtype
// signature, and parses the arguments. run() then checks the tensors against those types
// and calls the kernel on the given context's stream. On CUDA it does not wait for the
// kernel: failures a kernel records on the device are raised by the context's
// check_errors(), which waits (call_op and run_op do; a torch op leaves it to the caller).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/op_registry.h"
#include "core/op_schema.h"
#include "device/device_context.h"

namespace qg {

class PreparedOp {
 public:
  // qg::Error naming the op when the attributes, input types or device do not fit it, or
  // when the op is a graph source (input, parameter, constant), which has nothing to call.
  PreparedOp(const std::string& op, const Attrs& attrs, std::vector<TensorType> inputs,
             DeviceType device, const OpRegistry& registry = OpRegistry::instance());

  const OpDef& def() const { return *def_; }
  const KernelDef& kernel() const { return *kernel_; }
  const Attrs& attrs() const { return attrs_; }
  const std::vector<TensorType>& input_types() const { return inputs_; }
  const std::vector<TensorType>& output_types() const { return outputs_; }
  const std::vector<StateSpec>& state_specs() const { return states_; }
  // The op's persistent state as a fresh node starts it (observer ranges empty, flags set).
  std::vector<Tensor> initial_states(Device device) const;

  // Runs the kernel on `context`. `inputs` must match input_types() and lie on the context's
  // device (contiguous, unless the kernel reads strides); `states` must match state_specs()
  // and is updated in place. `outputs`: empty to allocate them here, or one tensor per
  // output of the inferred type, written in place (memory the caller allocated).
  std::vector<Tensor> run(DeviceContext& context, const std::vector<Tensor>& inputs,
                          std::vector<Tensor>& states, bool training = true,
                          std::vector<Tensor> outputs = {}) const;

 private:
  void check_operand(const char* what, size_t i, const std::string& name, const Tensor& t,
                     const TensorType& type, Device device, bool need_contiguous) const;

  const OpDef* def_;
  Attrs attrs_;
  std::vector<TensorType> inputs_;
  std::vector<TensorType> outputs_;
  std::vector<StateSpec> states_;
  DeviceType device_;
  const KernelDef* kernel_ = nullptr;
  std::shared_ptr<const PreparedArgs> prepared_;
};

// One call: prepares the op for these tensors' types, runs it and, on CUDA, waits and raises
// what the kernel recorded. `states` (null: the op's initial states, discarded) is updated.
std::vector<Tensor> call_op(DeviceContext& context, const std::string& op,
                            const std::vector<Tensor>& inputs, const Attrs& attrs = {},
                            std::vector<Tensor>* states = nullptr, bool training = true);

}  // namespace qg
