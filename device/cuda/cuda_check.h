// Every CUDA runtime call goes through QG_CUDA_CHECK, and every launch is followed by
// QG_CUDA_CHECK_LAUNCH: failures become qg::Error carrying CUDA's own error text.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define QG_CUDA_CHECK(op, call)                                          \
  do {                                                                   \
    cudaError_t qg_err_ = (call);                                        \
    if (qg_err_ != cudaSuccess) {                                        \
      QG_FAIL((op), #call, " failed: ", cudaGetErrorName(qg_err_), ": ", \
              cudaGetErrorString(qg_err_));                              \
    }                                                                    \
  } while (0)

#define QG_CUDA_CHECK_LAUNCH(op) QG_CUDA_CHECK((op), cudaGetLastError())
