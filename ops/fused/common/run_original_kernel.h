// Shared by the fused ops' composed kernels: running one of the original nodes a fused node
// took in (its parts) with its own registered kernel.
#pragma once

#include <string>
#include <vector>

#include "core/op_registry.h"

namespace qg {

// Runs the kernel of `original` (one of a fused node's prepared parts) for `dtype` on
// `device` with the given tensors, the fused node's training flag and stream; returns its
// outputs. `fused_op` names the fused op in the error when no such kernel exists.
std::vector<Tensor> run_original_kernel(const std::string& fused_op, const KernelPart& original,
                                        DeviceType device, DType dtype, std::vector<Tensor> inputs,
                                        std::vector<Tensor> outputs, std::vector<Tensor>& states,
                                        const KernelContext& fused);

}  // namespace qg
