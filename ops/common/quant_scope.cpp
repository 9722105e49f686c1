#include "ops/common/quant_scope.h"

#include "core/error.h"
#include "ops/common/schema_helpers.h"

namespace qg {

std::vector<AttrSpec> scope_attrs(const std::vector<std::string>& allowed) {
  return {string_attr("scope", "tensor", allowed, "granularity of the qparams"),
          int_attr("axis", 0, "channel/group axis; negative counts from the end"),
          int_attr("group_size", 128, "group scope: elements per group along the axis")};
}

ScopeLayout scope_layout(const std::string& op, const Attrs& attrs, const Shape& x) {
  ScopeLayout l;
  const std::string& scope = attrs.get_string("scope");
  int rank = static_cast<int>(x.size());
  if (scope == "tensor") {
    l.kind = ScopeKind::tensor;
    l.outer = shape_numel(x);
    l.qparam_shape = {1};
    return l;
  }
  if (scope == "token") {
    QG_CHECK(rank >= 1, op, "per-token scope needs rank >= 1, got shape ", shape_str(x));
    l.kind = ScopeKind::token;
    l.axis = rank - 1;
  } else {
    QG_CHECK(rank >= 1, op, "per-", scope, " scope needs rank >= 1, got shape ", shape_str(x));
    l.kind = scope == "channel" ? ScopeKind::channel : ScopeKind::group;
    l.axis = normalize_axis(op, "axis", attrs.get_int("axis"), rank);
  }
  l.outer = 1;
  for (int d = 0; d < l.axis; ++d) l.outer *= x[d];
  l.axis_len = x[l.axis];
  l.inner = 1;
  for (int d = l.axis + 1; d < rank; ++d) l.inner *= x[d];
  switch (l.kind) {
    case ScopeKind::channel:
      l.num_qparams = l.axis_len;
      l.qparam_shape = {l.axis_len};
      break;
    case ScopeKind::token:
      l.num_qparams = l.outer;
      l.qparam_shape = Shape(x.begin(), x.end() - 1);
      l.qparam_shape.push_back(1);
      break;
    case ScopeKind::group: {
      int64_t gs = attrs.get_int("group_size");
      QG_CHECK(gs > 0, op, "attribute 'group_size' = ", gs, " must be positive");
      l.group_size = gs;
      l.num_groups = (l.axis_len + gs - 1) / gs;
      l.num_qparams = l.outer * l.num_groups * l.inner;
      l.qparam_shape = x;
      l.qparam_shape[l.axis] = l.num_groups;
      break;
    }
    case ScopeKind::tensor:
      break;
  }
  return l;
}

void expect_qparam_shape(const std::string& op, const std::string& what, const TensorType& t,
                         const ScopeLayout& l) {
  bool ok = t.shape == l.qparam_shape;
  if (l.kind == ScopeKind::tensor) ok = t.numel() == 1 && t.shape.size() <= 1;
  if (l.kind == ScopeKind::token) {
    Shape squeezed(l.qparam_shape.begin(), l.qparam_shape.end() - 1);
    ok = ok || t.shape == squeezed;
  }
  QG_CHECK(ok, op, what, " has shape ", shape_str(t.shape), " but the scope needs ",
           shape_str(l.qparam_shape), l.kind == ScopeKind::tensor ? " (or [])" : "");
}

}  // namespace qg
