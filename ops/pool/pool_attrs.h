// Pooling attributes -> window geometry, validated (host only; the kernels of both backends
// and shape inference call it, so every bad attribute fails the same way, naming the op).
#pragma once

#include <memory>
#include <string>

#include "core/attrs.h"
#include "core/error.h"
#include "core/kernel_args.h"
#include "core/tensor.h"
#include "ops/pool/pool_geometry.h"

namespace qg {

// `input` is the NCHW input shape; attrs are kernel, stride (absent: the kernel), padding,
// dilation (absent: 1), ceil_mode, count_include_pad (absent: true).
pool::PoolGeom pool_geometry(const std::string& op, const Shape& input, const Attrs& attrs);

// The parsed arguments of max_pool2d, avg_pool2d and their backward ops: the window geometry
// over x's shape (the backward ops': attribute input_shape), shared by the CPU and CUDA kernels.
struct PoolArgs : KernelArgs {
  pool::PoolGeom geometry;
};

inline std::shared_ptr<const KernelArgs> parse_pool_args(const ArgsSource& s) {
  auto args = std::make_shared<PoolArgs>();
  if (s.attrs.has("input_shape")) {
    args->geometry = pool_geometry(s.op, s.attrs.get_ints("input_shape"), s.attrs);
  } else {
    QG_CHECK(!s.inputs.empty(), s.op, "has no input to pool");
    args->geometry = pool_geometry(s.op, s.inputs[0].shape, s.attrs);
  }
  return args;
}

}  // namespace qg
