// The range-checked real attributes of the optimizer ops (sgd, adam, adamw, clip_grad_norm):
// each names the op, the attribute and the value it rejects.
#pragma once

#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/common/schema_helpers.h"

namespace qg::optim_attrs {

// A finite real in [lo, hi] (or [lo, hi) when hi_open).
inline AttrSpec bounded_real(const std::string& name, double def, const std::string& doc, double lo,
                             double hi, bool hi_open) {
  AttrSpec s = real_attr(name, def, doc);
  s.validate = [name, lo, hi, hi_open](const std::string& op, const Attr& v) {
    double x = v.as_real();
    bool ok = std::isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi);
    QG_CHECK(ok, op, "attribute '", name, "' = ", x, " must be in [", lo, ", ", hi,
             hi_open ? ")" : "]");
  };
  return s;
}

// A finite real > 0.
inline AttrSpec positive_real(const std::string& name, double def, const std::string& doc) {
  AttrSpec s = real_attr(name, def, doc);
  s.validate = [name](const std::string& op, const Attr& v) {
    double x = v.as_real();
    QG_CHECK(std::isfinite(x) && x > 0.0, op, "attribute '", name, "' = ", x,
             " must be finite and > 0");
  };
  return s;
}

}  // namespace qg::optim_attrs
