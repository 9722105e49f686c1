// The static type of a graph value or kernel operand: dtype and shape.
#pragma once

#include <string>

#include "core/tensor.h"

namespace qg {

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
  std::string str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
};

}  // namespace qg
