// A backend runs kernels on one device, with the DeviceContext it owns (stream, library
// handles, error buffer, precision flags): each executor has its own, so two executors on
// two streams or two devices share no device state. Kernels live in the op registry keyed
// by device; the backend answers supports() up front so the executor never meets an
// unsupported (op, input dtypes) combination mid-graph.
#pragma once

#include <memory>

#include "core/graph.h"
#include "device/device_context.h"

namespace qg {

class Backend {
 public:
  explicit Backend(std::unique_ptr<DeviceContext> context);
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  Device device() const { return context_->device(); }
  DeviceContext& context() const { return *context_; }
  void* stream() const { return context_->stream(); }  // cudaStream_t on CUDA, else null
  void synchronize() { context_->synchronize(); }
  // Called after every kernel: on CUDA, checks the launch's last error.
  void after_kernel(const Node& node) { context_->check_launch(node.op->name); }
  // Called once at the end of every executor run (also after a failed one): on CUDA it
  // synchronises and raises the errors kernels recorded on the device (bad qparams, labels
  // out of range), since a kernel cannot throw.
  void after_run(const Graph& graph) { context_->check_errors(&graph); }

  // Whether a kernel of this device accepts the input dtypes (the full signature).
  bool supports(const OpDef& op, const std::vector<DType>& input_dtypes) const;
  // Throws qg::Error naming the op, the device, every input dtype and what the device's
  // kernels accept when there is no kernel.
  const KernelDef& kernel_for(const OpDef& op, const std::vector<DType>& input_dtypes) const;

 private:
  std::unique_ptr<DeviceContext> context_;
};

// CPU always; CUDA when built with it and a device is present (else qg::Error saying so).
std::unique_ptr<Backend> make_backend(Device device, const ContextOptions& options = {});

}  // namespace qg
