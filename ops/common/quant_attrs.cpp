#include "ops/common/quant_attrs.h"

#include <cmath>

#include "core/error.h"
#include "ops/common/schema_helpers.h"

namespace qg {

std::vector<AttrSpec> quant_range_attrs(bool with_reduce_range) {
  std::vector<AttrSpec> a = {
      int_attr("bits", 8, "integer width; 2..16", 2, 16),
      bool_attr("signed", false, "signed range [-2^(b-1), 2^(b-1)-1] instead of [0, 2^b-1]"),
      bool_attr("narrow_range", false, "signed only: drop the most negative code"),
  };
  AttrSpec qmin = int_attr("quant_min", std::nullopt, "explicit lower code (with quant_max)");
  qmin.optional = true;
  AttrSpec qmax = int_attr("quant_max", std::nullopt, "explicit upper code (with quant_min)");
  qmax.optional = true;
  a.push_back(qmin);
  a.push_back(qmax);
  if (with_reduce_range) a.push_back(bool_attr("reduce_range", false, "halve the range (PyTorch)"));
  return a;
}

std::vector<AttrSpec> qparams_attrs() {
  return {
      string_attr("qscheme", "affine", {"affine", "symmetric"}, "qparams scheme"),
      string_attr("symmetric_denominator", "half_range", {"half_range", "qmax"},
                  "symmetric scale = amax / ((qmax - qmin) / 2) or amax / qmax"),
      real_attr("eps", 1.1920928955078125e-07, "lower bound on the scale"),
  };
}

QuantRange quant_range_from_attrs(const std::string& op, const Attrs& attrs) {
  QuantRange r;
  int64_t bits = attrs.get_int("bits");
  QG_CHECK(bits >= 2 && bits <= 16, op, "attribute 'bits' = ", bits, " is outside [2, 16]");
  r.is_signed = attrs.get_bool("signed");
  bool has_min = attrs.has("quant_min"), has_max = attrs.has("quant_max");
  QG_CHECK(has_min == has_max, op, "quant_min and quant_max must be given together (got only ",
           has_min ? "quant_min" : "quant_max", ")");
  if (has_min) {
    r.qmin = attrs.get_int("quant_min");
    r.qmax = attrs.get_int("quant_max");
    r.custom = true;
    r.is_signed = r.qmin < 0;
  } else if (r.is_signed) {
    r.qmin = -(int64_t{1} << (bits - 1)) + (attrs.get_bool("narrow_range") ? 1 : 0);
    r.qmax = (int64_t{1} << (bits - 1)) - 1;
  } else {
    r.qmin = 0;
    r.qmax = (int64_t{1} << bits) - 1;
  }
  QG_CHECK(r.qmin < r.qmax, op, "quant_min = ", r.qmin, " must be below quant_max = ", r.qmax);
  QG_CHECK(r.qmin >= INT32_MIN && r.qmax <= INT32_MAX, op, "quant range [", r.qmin, ", ", r.qmax,
           "] does not fit in int32");
  if (attrs.has("reduce_range") && attrs.get_bool("reduce_range")) {
    // Python floor division, as PyTorch's observers do (-128 // 2 = -64, 255 // 2 = 127).
    auto floor_half = [](int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
    r.qmin = floor_half(r.qmin);
    r.qmax = floor_half(r.qmax);
    QG_CHECK(r.qmin < r.qmax, op, "reduce_range leaves an empty range [", r.qmin, ", ", r.qmax,
             "]");
  }
  return r;
}

qmath::QParamsConfig qparams_config_from_attrs(const std::string& op, const Attrs& attrs) {
  QuantRange r = quant_range_from_attrs(op, attrs);
  qmath::QParamsConfig c;
  c.qmin = static_cast<int32_t>(r.qmin);
  c.qmax = static_cast<int32_t>(r.qmax);
  c.symmetric = attrs.get_string("qscheme") == "symmetric";
  c.denominator_qmax = attrs.get_string("symmetric_denominator") == "qmax";
  double eps = attrs.get_real("eps");
  QG_CHECK(eps > 0 && std::isfinite(eps), op, "attribute 'eps' = ", eps,
           " must be positive and finite");
  c.eps = static_cast<float>(eps);
  // PyTorch: signed ranges get zp 0; the default unsigned 8-bit range gets 128; custom or
  // other unsigned ranges get the floor of the midpoint.
  bool default_u8 = !r.custom && !r.is_signed && r.qmin == 0 && r.qmax == 255;
  bool default_u8_reduced = !r.custom && !r.is_signed && r.qmin == 0 && r.qmax == 127;
  if (r.is_signed) {
    c.symmetric_zero_point = 0;
  } else if (default_u8 || default_u8_reduced) {
    c.symmetric_zero_point = 128;
  } else {
    int64_t s = r.qmin + r.qmax;
    c.symmetric_zero_point = static_cast<int32_t>(s >= 0 ? s / 2 : -((-s + 1) / 2));
  }
  return c;
}

void check_scale_value(const std::string& op, double scale, int64_t index) {
  QG_CHECK(std::isfinite(scale) && scale > 0, op, "scale[", index, "] = ", scale,
           " must be positive and finite");
}

void check_zero_point_value(const std::string& op, double zp, const QuantRange& r, int64_t index) {
  QG_CHECK(
      std::isfinite(zp) && zp >= static_cast<double>(r.qmin) && zp <= static_cast<double>(r.qmax),
      op, "zero_point[", index, "] = ", zp, " is outside [quant_min, quant_max] = [", r.qmin, ", ",
      r.qmax, "]");
}

std::vector<AttrSpec> concat_attrs(std::vector<AttrSpec> a, const std::vector<AttrSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace qg
