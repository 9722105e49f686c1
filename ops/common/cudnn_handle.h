// The cuDNN handle of a DeviceContext and the status check of cuDNN calls, shared by the
// cuDNN wrappers (ops/conv/conv_cudnn.cu, ops/attention/attention_cudnn.cpp). Include it only
// from a file that CMake compiles with cuDNN's headers (QG_WITH_CUDNN).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/error.h"
#include "device/device_context.h"

#define QG_CUDNN_CHECK(op, call)                                                             \
  do {                                                                                       \
    cudnnStatus_t qg_st_ = (call);                                                           \
    QG_CHECK(qg_st_ == CUDNN_STATUS_SUCCESS, (op), #call,                                    \
             " failed: ", cudnnGetErrorString(qg_st_), " (", static_cast<int>(qg_st_), ")"); \
  } while (0)

namespace qg {

// One handle per context, bound to its stream, made on first use: the op families that call
// cuDNN share it (the context keeps one slot per library).
inline cudnnHandle_t cudnn_handle(DeviceContext& context) {
  void* h = context.library_handle(
      LibraryHandle::cudnn,
      [](DeviceContext& c) -> void* {
        cudnnHandle_t created;
        QG_CUDNN_CHECK("cudnn", cudnnCreate(&created));
        QG_CUDNN_CHECK("cudnn", cudnnSetStream(created, static_cast<cudaStream_t>(c.stream())));
        return created;
      },
      [](void* handle) { (void)cudnnDestroy(static_cast<cudnnHandle_t>(handle)); });
  return static_cast<cudnnHandle_t>(h);
}

}  // namespace qg
