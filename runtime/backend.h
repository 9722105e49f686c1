// A backend runs kernels on one device. Kernels live in the op registry keyed by device;
// the backend answers supports() up front so the executor never meets an unsupported
// (op, input dtypes) combination mid-graph.
#pragma once

#include <memory>

#include "core/graph.h"

namespace qg {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual void* stream() const { return nullptr; }
  virtual void synchronize() {}
  // Called after every kernel: the CUDA backend checks the launch's last error here.
  virtual void after_kernel(const Node& node) { (void)node; }
  // Called once at the end of every executor run (also after a failed one): the CUDA
  // backend synchronises here and raises the errors its kernels recorded on the device
  // (bad qparams, labels out of range), since a kernel cannot throw.
  virtual void after_run(const Graph& graph) { (void)graph; }

  // Whether a kernel of this device accepts the input dtypes (the full signature).
  bool supports(const OpDef& op, const std::vector<DType>& input_dtypes) const;
  // Throws qg::Error naming the op, the device, every input dtype and what the device's
  // kernels accept when there is no kernel.
  const KernelDef& kernel_for(const OpDef& op, const std::vector<DType>& input_dtypes) const;
};

// CPU always; CUDA when built with it and a device is present (else qg::Error saying so).
std::unique_ptr<Backend> make_backend(Device device);
bool cuda_available();

}  // namespace qg
