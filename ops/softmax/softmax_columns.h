// The layout both softmax kernels (CPU and CUDA) read, the tensor as [outer, axis_len,
// inner] with one softmax per (outer, inner) column, and the softmax ops' parsed arguments.
#pragma once

#include <memory>
#include <string>

#include "core/attrs.h"
#include "core/kernel_args.h"
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

inline SoftmaxColumns softmax_columns(const std::string& op, const Attrs& attrs,
                                      const Shape& shape) {
  SoftmaxColumns c;
  int axis = softmax_axis(op, attrs, static_cast<int>(shape.size()));
  if (axis < 0) return c;
  for (int d = 0; d < axis; ++d) c.outer *= shape[d];
  c.axis_len = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) c.inner *= shape[d];
  return c;
}

// The parsed arguments of softmax, softmax_backward and the fused scaled softmax ops, shared
// by their CPU and CUDA kernels.
struct SoftmaxArgs : KernelArgs {
  SoftmaxColumns columns;    // over input 0 (x, or dy for the backward ops)
  bool scale_first = false;  // fused ops: the scale was the mul's first operand
};

inline std::shared_ptr<const KernelArgs> parse_softmax_args(const ArgsSource& s) {
  QG_CHECK(!s.inputs.empty(), s.op, "has no input to lay the softmax out over");
  auto args = std::make_shared<SoftmaxArgs>();
  args->columns = softmax_columns(s.op, s.attrs, s.inputs[0].shape);
  args->scale_first = s.attrs.has("scale_first") && s.attrs.get_int("scale_first") != 0;
  return args;
}

}  // namespace qg
