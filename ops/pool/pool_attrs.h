// Pooling attributes -> window geometry, validated (host only; the kernels of both backends
// and shape inference call it, so every bad attribute fails the same way, naming the op).
#pragma once

#include <string>

#include "core/attrs.h"
#include "core/tensor.h"
#include "ops/pool/pool_geometry.h"

namespace qg {

// `input` is the NCHW input shape; attrs are kernel, stride (absent: the kernel), padding,
// dilation (absent: 1), ceil_mode, count_include_pad (absent: true).
pool::PoolGeom pool_geometry(const std::string& op, const Shape& input, const Attrs& attrs);

}  // namespace qg
