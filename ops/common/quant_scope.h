// How a quantization scope maps elements to their (scale, zero_point): the tensor is viewed
// as [outer, axis_len, inner] around the scope's axis. Shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/op_schema.h"
#include "ops/common/quant_math.h"

namespace qg {

enum class ScopeKind : int32_t { tensor, channel, token, group };

struct ScopeLayout {
  ScopeKind kind = ScopeKind::tensor;
  int axis = 0;  // normalised; the last axis for token
  int64_t outer = 1, axis_len = 1, inner = 1;
  int64_t group_size = 1;  // group scope only
  int64_t num_groups = 1;  // ceil(axis_len / group_size): the tail group is smaller
  int64_t num_qparams = 1;
  Shape qparam_shape;  // the shape scale and zero_point must have
};

// Index of the qparams for element (o, a, i) of the [outer, axis_len, inner] view.
QG_HD int64_t qparam_index(const ScopeLayout& l, int64_t o, int64_t a, int64_t i) {
  switch (l.kind) {
    case ScopeKind::tensor:
      return 0;
    case ScopeKind::channel:
      return a;
    case ScopeKind::token:
      return o;
    case ScopeKind::group:
      return (o * l.num_groups + a / l.group_size) * l.inner + i;
  }
  return 0;
}

// scope ("tensor" | "channel" | "token" | "group"), axis, group_size. `allowed` limits the
// scopes an op offers (observers offer tensor and channel).
std::vector<AttrSpec> scope_attrs(const std::vector<std::string>& allowed = {"tensor", "channel",
                                                                             "token", "group"});
// Validates the scope against the input shape (axis range, group_size > 0) and lays it out.
ScopeLayout scope_layout(const std::string& op, const Attrs& attrs, const Shape& x_shape);
// Throws unless `t` matches the scope's qparam shape ([] or [1] for per-tensor).
void expect_qparam_shape(const std::string& op, const std::string& what, const TensorType& t,
                         const ScopeLayout& l);

}  // namespace qg
