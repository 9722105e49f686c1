// Leaves: integer weights become int8 initializers + DequantizeLinear; everything else an
// initializer holding its eval-mode value.
//
// Weights (the converted graph's `dequantize` of int8 codes, or `int4_unpack_dequantize` of
// packed INT4 / int2 codes) are stored as int8 codes with the zero point subtracted, so
// every code is exact (ONNX 1.12 has no 4-bit type: int4 codes -8..7 and int2 codes -2..1
// sit in int8 tensors), with zero point 0:
//   per tensor:   DequantizeLinear(codes, scale[], zp[])
//   per channel:  DequantizeLinear(codes [out, ...], scale[out], zp[out], axis=0)
//   group-wise:   opset 17 has no blocked quantization, so each row of `in` weights is cut
//                 into groups of g (the last one padded with code 0 to a whole group):
//                 codes [out * groups, g] -> DequantizeLinear(axis=0) -> Reshape
//                 [out, groups * g] -> Slice to [out, in] (when padded) -> the layer's shape.
//                 Every weight is code * its group's scale, as in qatgraph.
// At opset 21 (the Llama export), codes that come from packed INT4 (the int4, int3 and int2
// recipes: every code in -8..7) are stored as INT4, two a byte, without a zero point:
//   per tensor / per channel:  DequantizeLinear(codes [out, ...], scale[] / scale[out], axis 0)
//   group-wise:               DequantizeLinear(codes [out, in], scale [out, groups], axis 1,
//                             block_size g): a shorter last group is ONNX's partial block.
// A float zero point (int4 weight-only, nn/convert_float_zero.h: packed unsigned codes
// dequantized with zero point mid, then the group's float zero added over a
// [out, groups, group_size] view) keeps that form: INT4 codes q - mid + DequantizeLinear as
// above, Reshape [out, groups, g], Add the f32 zeros [out, groups, 1], Reshape back. ONNX's
// zero point must have the codes' integer type, so the float zero cannot go inside
// DequantizeLinear; both steps are exact f32 operations, as in qatgraph.
// NF4 has no ONNX form: its dequantized f32 weights are exported, with a warning.
#include <algorithm>

#include "core/error.h"
#include "export/onnx/onnx_context.h"
#include "export/onnx/onnx_export.h"
#include "ops/common/quant_scope.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

struct IntWeight {
  std::string base;           // "fc1.weight"
  int64_t out = 0, in = 0;    // the [out, in] matrix the codes form
  std::vector<int8_t> codes;  // out * in, zero point subtracted
  std::vector<float> scales;  // 1 (per tensor), out (per row) or out * groups
  bool per_tensor = false;
  int64_t group_size = 0, groups = 1;  // groups > 1: group-wise along each row
  bool four_bit = false;               // codes of packed INT4 (every code in -8..7)
};

bool constant_inputs(const Context& ctx, const Node& n) {
  for (ValueId in : n.inputs)
    if (ctx.producer(in).op->name != "constant") return false;
  return true;
}

const Tensor& constant_of(const Context& ctx, ValueId v) {
  return ctx.producer(v).value;
}

std::string weight_base(const std::string& node_name) {
  for (const std::string suffix : {".int.dequantize", ".dequantize"})
    if (node_name.size() > suffix.size() &&
        node_name.compare(node_name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return node_name.substr(0, node_name.size() - suffix.size());
  return node_name;
}

int8_t exact_code(double code, double zero_point, const std::string& base) {
  const double c = code - zero_point;
  QG_CHECK(c >= -128 && c <= 127, kOp, "weight '", base, "': code ", code, " - zero point ",
           zero_point, " does not fit int8");
  return static_cast<int8_t>(c);
}

// dequantize(codes i8 [out, in], scale, zero_point) per tensor, per row or per group of a row.
IntWeight from_dequantize(const Context& ctx, const Node& n) {
  IntWeight w;
  w.base = weight_base(n.name);
  const Tensor& codes = constant_of(ctx, n.inputs[0]);
  const Tensor& scale = constant_of(ctx, n.inputs[1]);
  const Tensor& zp = constant_of(ctx, n.inputs[2]);
  QG_CHECK(codes.dim() == 2, kOp, "weight '", w.base, "' has codes ", codes.str(),
           "; only [out, in] matrices are exported as integers");
  w.out = codes.shape()[0];
  w.in = codes.shape()[1];
  ScopeLayout l = scope_layout(kOp, n.attrs, codes.shape());
  const bool rows = l.kind == ScopeKind::channel && l.axis == 0;
  const bool groups = l.kind == ScopeKind::group && l.axis == 1;
  QG_CHECK(l.kind == ScopeKind::tensor || rows || groups, kOp, "weight '", w.base, "': scope ",
           n.attrs.get_string("scope"), " on axis ", l.axis,
           " has no DequantizeLinear form (per tensor, per row or groups along a row)");
  w.per_tensor = l.kind == ScopeKind::tensor;
  if (groups) {
    w.group_size = l.group_size;
    w.groups = l.num_groups;
  }
  w.codes.resize(static_cast<size_t>(w.out * w.in));
  for (int64_t o = 0, k = 0; o < l.outer; ++o)
    for (int64_t a = 0; a < l.axis_len; ++a)
      for (int64_t i = 0; i < l.inner; ++i, ++k)
        w.codes[k] = exact_code(codes.at(k), zp.at(qparam_index(l, o, a, i)), w.base);
  for (int64_t q = 0; q < scale.numel(); ++q) w.scales.push_back(static_cast<float>(scale.at(q)));
  return w;
}

// int4_unpack_dequantize(packed u8, scale [out, groups], zero_point u8 [out, groups]) of an
// [out, in] matrix, groups along each row (nn/convert.cpp: one group per row for the channel
// and tensor scopes).
IntWeight from_int4(const Context& ctx, const Node& n) {
  IntWeight w;
  w.base = weight_base(n.name);
  const Shape shape = n.attrs.get_ints("shape");
  const int64_t axis = n.attrs.get_int("axis");
  QG_CHECK(shape.size() == 2 && (axis == -1 || axis == 1), kOp, "weight '", w.base,
           "': packed INT4 of shape ", shape_str(shape), " grouped on axis ", axis,
           "; only [out, in] matrices grouped along rows are exported");
  w.out = shape[0];
  w.in = shape[1];
  w.group_size = std::min(n.attrs.get_int("group_size"), w.in);
  w.groups = (w.in + w.group_size - 1) / w.group_size;
  const bool high_first = n.attrs.get_string("nibble_order") == "high_first";
  const Tensor& packed = constant_of(ctx, n.inputs[0]);
  const Tensor& scale = constant_of(ctx, n.inputs[1]);
  const Tensor& zp = constant_of(ctx, n.inputs[2]);
  QG_CHECK(scale.numel() == w.out * w.groups && zp.numel() == scale.numel(), kOp, "weight '",
           w.base, "': ", scale.numel(), " scales for ", w.out, " rows of ", w.groups, " groups");
  const uint8_t* bytes = packed.data<uint8_t>();
  w.codes.resize(static_cast<size_t>(w.out * w.in));
  for (int64_t o = 0; o < w.out; ++o)
    for (int64_t k = 0; k < w.in; ++k) {
      const int64_t e = o * w.in + k;
      const bool low = (e % 2 == 0) != high_first;
      const int nibble = low ? bytes[e / 2] & 0xf : bytes[e / 2] >> 4;
      w.codes[e] = exact_code(nibble, zp.at(o * w.groups + k / w.group_size), w.base);
    }
  for (int64_t q = 0; q < scale.numel(); ++q) w.scales.push_back(static_cast<float>(scale.at(q)));
  if (w.groups == 1) w.group_size = 0;  // one scale per row: per channel
  w.four_bit = true;
  return w;
}

std::string reshape(Context& ctx, const std::string& x, const Shape& shape,
                    const std::string& base) {
  return ctx.node1("Reshape", {x, ctx.initializer_i64(base + ".shape", shape)}, base);
}

// INT4 codes + DequantizeLinear (opset 21): per tensor, per row (axis 0) or in blocks of g
// along each row (axis 1, block_size).
std::string emit_int4_weight(Context& ctx, const IntWeight& w, const Shape& shape) {
  const bool blocked = w.groups > 1;
  std::string codes =
      ctx.initializer_i4(w.base + "_quantized", blocked ? Shape{w.out, w.in} : shape, w.codes);
  const Shape qshape = w.per_tensor ? Shape{} : blocked ? Shape{w.out, w.groups} : Shape{w.out};
  std::string scale = ctx.initializer_f32(w.base + "_scale", qshape, w.scales);
  AttrList a;
  if (blocked)
    a = {attr_int("axis", 1), attr_int("block_size", w.group_size)};
  else if (!w.per_tensor)
    a = {attr_int("axis", 0)};
  std::string y = ctx.node1("DequantizeLinear", {codes, scale}, w.base + "_dequantized", a);
  if (blocked && shape != Shape{w.out, w.in})
    y = reshape(ctx, y, shape, w.base + "_dequantized_kernel");
  return y;
}

std::string emit_int_weight(Context& ctx, const IntWeight& w, const Shape& shape) {
  QG_CHECK(shape_numel(shape) == w.out * w.in && !shape.empty() && shape[0] == w.out, kOp,
           "weight '", w.base, "' [", w.out, ", ", w.in, "] is read as ", shape_str(shape));
  if (w.four_bit && ctx.opset() >= kInt4Opset) return emit_int4_weight(ctx, w, shape);
  const std::string q = w.base + "_quantized";
  if (w.groups <= 1) {
    // Axis 0 survives the reshape to the layer's shape ([out, in] or [O, C, kh, kw]), so the
    // codes are stored in that shape and DequantizeLinear feeds the layer directly.
    std::string codes = ctx.initializer_i8(q, shape, w.codes);
    const Shape qshape = w.per_tensor ? Shape{} : Shape{w.out};
    std::string scale = ctx.initializer_f32(w.base + "_scale", qshape, w.scales);
    std::string zp =
        ctx.initializer_i8(w.base + "_zero_point", qshape, std::vector<int8_t>(w.scales.size(), 0));
    AttrList axis;
    if (!w.per_tensor) axis.push_back(attr_int("axis", 0));
    return ctx.node1("DequantizeLinear", {codes, scale, zp}, w.base + "_dequantized", axis);
  }
  const int64_t g = w.group_size, rows = w.out * w.groups, padded = w.groups * g;
  std::vector<int8_t> codes(static_cast<size_t>(rows * g), 0);
  for (int64_t o = 0; o < w.out; ++o)
    std::copy(w.codes.begin() + o * w.in, w.codes.begin() + (o + 1) * w.in,
              codes.begin() + o * padded);
  std::string c = ctx.initializer_i8(q, {rows, g}, codes);
  std::string s = ctx.initializer_f32(w.base + "_scale", {rows}, w.scales);
  std::string z = ctx.initializer_i8(w.base + "_zero_point", {rows}, std::vector<int8_t>(rows, 0));
  std::string y = ctx.node1("DequantizeLinear", {c, s, z}, w.base + "_dequantized_groups",
                            {attr_int("axis", 0)});
  y = reshape(ctx, y, {w.out, padded}, w.base + "_dequantized_rows");
  if (padded != w.in)
    y = ctx.node1(
        "Slice",
        {y, ctx.initializer_i64(w.base + ".starts", {0}),
         ctx.initializer_i64(w.base + ".ends", {w.in}), ctx.initializer_i64(w.base + ".axes", {1})},
        w.base + "_dequantized");
  if (shape != Shape{w.out, w.in}) y = reshape(ctx, y, shape, w.base + "_dequantized_kernel");
  return y;
}

ValueId through_reshapes(const Context& ctx, ValueId v) {
  while (ctx.producer(v).op->name == "reshape") v = ctx.producer(v).inputs[0];
  return v;
}

// add(reshape(int4_unpack_dequantize(...)) [out, groups, g], zero [out, groups, 1]): the
// float-zero weight of nn/convert_float_zero.cpp.
bool is_float_zero_weight(const Context& ctx, const Node& add) {
  if (add.op->name != "add" || add.inputs.size() != 2) return false;
  const Node& deq = ctx.producer(through_reshapes(ctx, add.inputs[0]));
  return deq.op->name == "int4_unpack_dequantize" && constant_inputs(ctx, deq) &&
         ctx.producer(add.inputs[1]).op->name == "constant";
}

std::string emit_float_zero_weight(Context& ctx, const Node& add, const Shape& shape) {
  const Node& deq = ctx.producer(through_reshapes(ctx, add.inputs[0]));
  const IntWeight w = from_int4(ctx, deq);
  const Tensor& zero = constant_of(ctx, add.inputs[1]);
  const int64_t groups = w.groups, g = groups > 1 ? w.group_size : w.in;
  QG_CHECK(zero.numel() == w.out * groups && groups * g == w.in, kOp, "weight '", w.base,
           "': ", zero.numel(), " float zeros for ", w.out, " rows of ", groups, " groups of ", g,
           " (the groups must tile the row)");
  std::vector<float> zeros(static_cast<size_t>(zero.numel()));
  for (int64_t i = 0; i < zero.numel(); ++i) zeros[i] = static_cast<float>(zero.at(i));
  std::string y = emit_int_weight(ctx, w, {w.out, w.in});
  y = reshape(ctx, y, {w.out, groups, g}, w.base + "_dequantized_groups");
  y = ctx.node1("Add", {y, ctx.initializer_f32(w.base + "_zero", {w.out, groups, 1}, zeros)},
                w.base + "_dequantized_shifted");
  return reshape(ctx, y, shape, w.base + "_dequantized_float_zero");
}

// The node a weight comes from: a weight reaches its layer through reshapes only
// ([out, in] -> [O, C, kh, kw]).
const Node& weight_source(const Context& ctx, ValueId v) {
  while (ctx.producer(v).op->name == "reshape") v = ctx.producer(v).inputs[0];
  return ctx.producer(v);
}

// Converted integer weights: codes and their DequantizeLinear (and float zeros).
bool has_integer_form(const Context& ctx, const Node& p) {
  return ((p.op->name == "dequantize" || p.op->name == "int4_unpack_dequantize") &&
          constant_inputs(ctx, p)) ||
         is_float_zero_weight(ctx, p);
}

}  // namespace

std::string emit_leaf(Context& ctx, ValueId v) {
  // A bf16-mixed layer's compute copy of its weight (cast to bf16).
  const Node& c = ctx.producer(v);
  const DType to = ctx.graph().value(v).type.dtype;
  if (c.op->name == "cast" && ctx.graph().value(c.inputs[0]).type.dtype == DType::f32 &&
      to == DType::bf16) {
    // Integer codes stay codes, then rounded as the cast rounds them.
    if (has_integer_form(ctx, weight_source(ctx, c.inputs[0])))
      return ctx.round_to(ctx.value(c.inputs[0]), to, c.name, "cast '" + c.name + "'");
    // A float weight: the bf16 values the model computes with, stored as bf16 and widened.
    return ctx.cast(ctx.initializer(ctx.base_name(v), ctx.leaf(v)),
                    onnx::TensorProto_DataType_FLOAT, ctx.base_name(v) + ".f32");
  }
  const Node& p = weight_source(ctx, v);
  if (p.op->name == "dequantize" && constant_inputs(ctx, p))
    return emit_int_weight(ctx, from_dequantize(ctx, p), ctx.shape(v));
  if (p.op->name == "int4_unpack_dequantize" && constant_inputs(ctx, p))
    return emit_int_weight(ctx, from_int4(ctx, p), ctx.shape(v));
  if (is_float_zero_weight(ctx, p)) return emit_float_zero_weight(ctx, p, ctx.shape(v));
  if (p.op->name == "nf4_unpack_dequantize")
    ctx.warn("weight '" + weight_base(p.name) +
             "': NF4 has no ONNX form; exported as its dequantized f32 values (exact, but "
             "4x the NF4 size)");
  return ctx.initializer(ctx.base_name(v), ctx.leaf(v));
}

}  // namespace qg::onnx_export
