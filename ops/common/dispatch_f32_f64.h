// Calls fn(float{}) or fn(double{}) for kernels that exist in f32 and f64 only (conv2d, the
// norms). Those types are the same on the host and the device, so CPU and CUDA kernels share
// this one dispatch.
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qg {

template <typename Fn>
void dispatch_f32_f64(DType dtype, const std::string& op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    default:
      break;
  }
  QG_FAIL(op, "the kernel takes f32 or f64, got ", dtype_name(dtype));
}

}  // namespace qg
