// The layout both softmax kernels (CPU and CUDA) read: the tensor as [outer, axis_len,
// inner], one softmax per (outer, inner) column.
#pragma once

#include <string>

#include "core/attrs.h"
#include "core/tensor.h"
#include "ops/common/schema_helpers.h"

namespace qg {

struct SoftmaxColumns {
  int64_t outer = 1, axis_len = 1, inner = 1;
};

// The normalised axis, or -1 for a scalar (a one-element softmax along its implicit axis, as
// in PyTorch, which accepts axis 0 and -1 there). Throws naming the op and `axis`.
inline int softmax_axis(const std::string& op, const Attrs& attrs, int rank) {
  if (rank == 0) {
    normalize_axis(op, "axis", attrs.get_int("axis"), 1);
    return -1;
  }
  return normalize_axis(op, "axis", attrs.get_int("axis"), rank);
}

inline SoftmaxColumns softmax_columns(const std::string& op, const Attrs& attrs, const Tensor& t) {
  SoftmaxColumns c;
  int axis = softmax_axis(op, attrs, t.dim());
  if (axis < 0) return c;
  const Shape& shape = t.shape();
  for (int d = 0; d < axis; ++d) c.outer *= shape[d];
  c.axis_len = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) c.inner *= shape[d];
  return c;
}

}  // namespace qg
