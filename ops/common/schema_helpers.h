// Small helpers shared by op declarations: attribute specs with validators and the checks
// that shape inference repeats (dtype classes, ranks, broadcasting).
#pragma once

#include <string>
#include <vector>

#include "core/op_schema.h"

namespace qg {

AttrSpec int_attr(const std::string& name, std::optional<int64_t> def, const std::string& doc,
                  int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
AttrSpec real_attr(const std::string& name, std::optional<double> def, const std::string& doc);
AttrSpec bool_attr(const std::string& name, bool def, const std::string& doc);
AttrSpec string_attr(const std::string& name, std::optional<std::string> def,
                     const std::vector<std::string>& choices, const std::string& doc);
AttrSpec ints_attr(const std::string& name, std::optional<std::vector<int64_t>> def,
                   const std::string& doc);

void expect_float(const InferContext& ctx, int input);
// For ops whose kernels exist in f32 and f64 only (conv2d, the norms).
void expect_f32_or_f64(const InferContext& ctx, int input);
void expect_integral(const InferContext& ctx, int input);
void expect_same_dtype(const InferContext& ctx, int a, int b);
void expect_rank(const InferContext& ctx, int input, int rank);
// Normalises a possibly negative axis against `rank`; throws naming the op and attribute.
int normalize_axis(const std::string& op, const std::string& attr, int64_t axis, int rank);
// NumPy broadcasting of two shapes; throws naming the op and both shapes.
Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b);

// Output dtype for a pure-function float op: all float inputs share one dtype.
std::vector<TensorType> same_as_input(const InferContext& ctx, int input = 0);

}  // namespace qg
