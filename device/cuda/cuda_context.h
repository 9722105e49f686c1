// The CUDA side of a DeviceContext: its stream as a cudaStream_t and its error record, as
// the CUDA kernels take them.
#pragma once

#include <cuda_runtime.h>

#include "device/cuda/device_error.h"
#include "device/device_context.h"

// In namespace qg, beside DeviceContext, so that kernels in any namespace find them.
namespace qg {

inline cudaStream_t cuda_stream(const DeviceContext& context) {
  return static_cast<cudaStream_t>(context.stream());
}

inline cuda::DeviceErrorRecord* error_record(const DeviceContext& context) {
  return static_cast<cuda::DeviceErrorRecord*>(context.error_buffer());
}

}  // namespace qg
