// The attributes every quantizing op shares (bits, signedness, narrow range, explicit
// quant_min/quant_max, reduce_range, qscheme, eps) and their resolution into an integer
// range and a qparams configuration, with the validation SEMANTICS.md requires.
#pragma once

#include <string>
#include <vector>

#include "core/op_schema.h"
#include "ops/common/quant_math.h"

namespace qg {

struct QuantRange {
  int64_t qmin = 0;
  int64_t qmax = 255;
  bool custom = false;  // given as explicit quant_min/quant_max
  bool is_signed = false;
};

// bits, signed, narrow_range, quant_min, quant_max (+ reduce_range when asked).
std::vector<AttrSpec> quant_range_attrs(bool with_reduce_range = false);
// qscheme ("affine" | "symmetric"), symmetric_denominator ("half_range" | "qmax"), eps.
std::vector<AttrSpec> qparams_attrs();

// Throws qg::Error naming the op for bits outside [2, 16], qmin >= qmax, or a range beyond
// int32.
QuantRange quant_range_from_attrs(const std::string& op, const Attrs& attrs);
qmath::QParamsConfig qparams_config_from_attrs(const std::string& op, const Attrs& attrs);

// Runtime checks of qparams values, naming the op and the offending element.
void check_scale_value(const std::string& op, double scale, int64_t index);
void check_zero_point_value(const std::string& op, double zp, const QuantRange& r, int64_t index);

std::vector<AttrSpec> concat_attrs(std::vector<AttrSpec> a, const std::vector<AttrSpec>& b);

}  // namespace qg
