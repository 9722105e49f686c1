// The cuBLAS handle of a DeviceContext, and the check every cuBLAS call goes through.
#pragma once

#include "core/error.h"
#include "device/cuda/cublas_api.h"
#include "device/device_context.h"

#define QG_CUBLAS_CHECK(op, call)                                                 \
  do {                                                                            \
    cublasStatus_t qg_st_ = (call);                                               \
    QG_CHECK(qg_st_ == CUBLAS_STATUS_SUCCESS, (op), #call,                        \
             " failed: ", ::qg::cuda::cublas_api().GetStatusString(qg_st_), " (", \
             static_cast<int>(qg_st_), ")");                                      \
  } while (0)

namespace qg::cuda {

// The context's handle, bound to its stream (made on first use). The math mode is the
// caller's to set before each call: families differ in what they allow f32 to use.
cublasHandle_t cublas_handle(DeviceContext& context);

}  // namespace qg::cuda
