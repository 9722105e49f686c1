#include "ops/common/schema_helpers.h"

#include <algorithm>

#include "core/error.h"

namespace qg {

AttrSpec int_attr(const std::string& name, std::optional<int64_t> def, const std::string& doc,
                  int64_t lo, int64_t hi) {
  AttrSpec s;
  s.name = name;
  s.type = AttrType::integer;
  if (def) s.default_value.emplace(*def);
  s.doc = doc;
  if (lo != INT64_MIN || hi != INT64_MAX) {
    s.validate = [name, lo, hi](const std::string& op, const Attr& v) {
      QG_CHECK(v.as_int() >= lo && v.as_int() <= hi, op, "attribute '", name, "' = ", v.as_int(),
               " is outside [", lo, ", ", hi, "]");
    };
  }
  return s;
}

AttrSpec real_attr(const std::string& name, std::optional<double> def, const std::string& doc) {
  AttrSpec s;
  s.name = name;
  s.type = AttrType::real;
  if (def) s.default_value.emplace(*def);
  s.doc = doc;
  return s;
}

AttrSpec bool_attr(const std::string& name, bool def, const std::string& doc) {
  AttrSpec s;
  s.name = name;
  s.type = AttrType::boolean;
  s.default_value.emplace(def);
  s.doc = doc;
  return s;
}

AttrSpec string_attr(const std::string& name, std::optional<std::string> def,
                     const std::vector<std::string>& choices, const std::string& doc) {
  AttrSpec s;
  s.name = name;
  s.type = AttrType::string;
  if (def) s.default_value.emplace(*def);
  s.doc = doc;
  if (!choices.empty()) {
    s.validate = [name, choices](const std::string& op, const Attr& v) {
      if (std::find(choices.begin(), choices.end(), v.as_string()) != choices.end()) return;
      std::string list;
      for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
      QG_FAIL(op, "attribute '", name, "' = \"", v.as_string(), "\" is not one of: ", list);
    };
  }
  return s;
}

AttrSpec ints_attr(const std::string& name, std::optional<std::vector<int64_t>> def,
                   const std::string& doc) {
  AttrSpec s;
  s.name = name;
  s.type = AttrType::int_list;
  if (def) s.default_value.emplace(*def);
  s.doc = doc;
  return s;
}

void expect_float(const InferContext& ctx, int i) {
  QG_CHECK(is_floating(ctx.inputs[i].dtype), ctx.op, "input ", i,
           " must be floating point (f32, f64, f16, bf16), got ", ctx.inputs[i].str());
}

void expect_f32_or_f64(const InferContext& ctx, int i) {
  DType d = ctx.inputs[i].dtype;
  QG_CHECK(d == DType::f32 || d == DType::f64, ctx.op, "input ", i,
           " must be f32 or f64 (this op has no f16/bf16 kernels; cast first), got ",
           ctx.inputs[i].str());
}

void expect_integral(const InferContext& ctx, int i) {
  QG_CHECK(is_integral(ctx.inputs[i].dtype), ctx.op, "input ", i,
           " must be an integer tensor, got ", ctx.inputs[i].str());
}

void expect_same_dtype(const InferContext& ctx, int a, int b) {
  QG_CHECK(ctx.inputs[a].dtype == ctx.inputs[b].dtype, ctx.op, "dtype mismatch: input ", a, " is ",
           ctx.inputs[a].str(), " but input ", b, " is ", ctx.inputs[b].str());
}

void expect_rank(const InferContext& ctx, int i, int rank) {
  QG_CHECK(static_cast<int>(ctx.inputs[i].shape.size()) == rank, ctx.op, "input ", i,
           " must have rank ", rank, ", got ", ctx.inputs[i].str());
}

int normalize_axis(const std::string& op, const std::string& attr, int64_t axis, int rank) {
  int64_t a = axis < 0 ? axis + rank : axis;
  QG_CHECK(a >= 0 && a < rank, op, "attribute '", attr, "' = ", axis,
           " is out of range for a tensor of rank ", rank);
  return static_cast<int>(a);
}

Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    QG_CHECK(da == db || da == 1 || db == 1, op, "shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<TensorType> same_as_input(const InferContext& ctx, int input) {
  return {ctx.inputs[input]};
}

}  // namespace qg
