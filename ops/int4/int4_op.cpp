// INT4 group quantization with two codes per byte (SEMANTICS.md, "INT4 (group-wise)"):
//   int4_quantize_pack(x) -> (packed, scale, zero_point)
//   int4_unpack_dequantize(packed, scale, zero_point) -> x'
// Groups are `group_size` consecutive elements along `axis` (default: the last); the last
// group of a row may be shorter. Codes are packed in flat C order over the whole tensor,
// two per byte. Neither op is differentiable (storage formats, not training ops).
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/packed_args.h"

namespace qg {
namespace {

std::vector<AttrSpec> layout_attrs() {
  AttrSpec group_size =
      int_attr("group_size", 128, "elements per group along the axis (the last may be shorter)");
  group_size.validate = [](const std::string& op, const Attr& v) {
    QG_CHECK(v.as_int() > 0, op, "attribute 'group_size' = ", v.as_int(), " must be positive");
  };
  return {
      group_size,
      int_attr("axis", -1, "the axis groups run along; negative counts from the end"),
      string_attr("nibble_order", "low_first", {"low_first", "high_first"},
                  "low_first: even element in the low nibble (seed layout); high_first: "
                  "bitsandbytes/torchao layout"),
  };
}

std::vector<TensorType> infer_quantize_pack(const InferContext& ctx) {
  expect_float(ctx, 0);
  const Shape& shape = ctx.inputs[0].shape;
  ScopeLayout l = int4_group_layout(ctx.op, ctx.attrs, shape);
  DType scale_dtype = ctx.inputs[0].dtype == DType::f64 ? DType::f64 : DType::f32;
  return {TensorType{DType::u8, {int4::packed_bytes(shape_numel(shape))}},
          TensorType{scale_dtype, l.qparam_shape}, TensorType{DType::u8, l.qparam_shape}};
}

std::vector<TensorType> infer_unpack_dequantize(const InferContext& ctx) {
  const Shape shape = check_packed_codes(ctx);
  ScopeLayout l = int4_group_layout(ctx.op, ctx.attrs, shape);
  const TensorType& scale = ctx.inputs[1];
  const TensorType& zp = ctx.inputs[2];
  QG_CHECK(scale.dtype == DType::f32 || scale.dtype == DType::f64, ctx.op,
           "scale must be f32 or f64, got ", scale.str());
  QG_CHECK(zp.dtype == DType::u8 || zp.dtype == DType::i32, ctx.op,
           "zero_point must be u8 or i32, got ", zp.str());
  QG_CHECK(scale.shape == l.qparam_shape, ctx.op, "scale has shape ", shape_str(scale.shape),
           " but shape ", shape_str(shape), " with group_size ", l.group_size, " needs ",
           shape_str(l.qparam_shape));
  QG_CHECK(zp.shape == l.qparam_shape, ctx.op, "zero_point has shape ", shape_str(zp.shape),
           " but shape ", shape_str(shape), " with group_size ", l.group_size, " needs ",
           shape_str(l.qparam_shape));
  const std::string& out = ctx.attrs.get_string("dtype");
  DType dtype = out == "auto" ? scale.dtype : dtype_from_name(out);
  return {TensorType{dtype, shape}};
}

}  // namespace

void add_int4_cuda_kernels(OpRegistry& r);  // int4_cuda.cu
void add_int4_crosscheck(OpRegistry& r);    // int4_crosscheck.cpp

void define_int4_ops(OpRegistry& r) {
  OpDef& q = r.define("int4_quantize_pack");
  q.doc =
      "Group-wise 4-bit quantization packed two codes per byte. symmetric: scale = absmax / 7, "
      "code = clamp(rint(x / scale), -8, 7) + 8, zero_point = 8; asymmetric: scale = (max - "
      "min) / 15 over the range including 0, zero_point = clamp(rint(-min / scale), 0, 15), "
      "code = clamp(rint(x / scale) + zero_point, 0, 15) (x / scale is x * (1 / scale)). The "
      "range uses finite values only; NaN -> zero_point, +/-Inf -> end codes; a group whose "
      "scale is 0 or has no finite reciprocal (all zeros) gets scale 1. packed is the flat "
      "C-order code stream, element k in byte k / 2 (low nibble first unless nibble_order = "
      "high_first), an odd count padding the last byte with a 0 nibble. scale (f32; f64 for "
      "f64 x) and zero_point (u8) have x's shape with the axis cut to ceil(len / group_size).";
  q.inputs = {"x"};
  q.outputs = {"packed", "scale", "zero_point"};
  q.attrs = layout_attrs();
  q.attrs.push_back(string_attr("mode", "symmetric", {"symmetric", "asymmetric"},
                                "symmetric (absmax / 7, zp 8) or asymmetric (min/max, zp)"));
  q.infer = infer_quantize_pack;
  q.parse_args = parse_packed_args;
  q.kernels.push_back({DeviceType::cpu, kFloatDTypes, int4_quantize_pack_cpu});

  OpDef& d = r.define("int4_unpack_dequantize");
  d.doc =
      "Inverse of int4_quantize_pack: x' = (code - zero_point) * scale, with `shape` the "
      "logical shape and the same group_size, axis and nibble_order. The packed buffer must "
      "hold exactly ceil(numel / 2) bytes; zero_point (u8 or i32) must lie in [0, 15]. The "
      "math runs in the scale's type; `dtype` picks the output type (auto = scale's).";
  d.inputs = {"packed", "scale", "zero_point"};
  d.outputs = {"x"};
  d.attrs = layout_attrs();
  d.attrs.push_back(ints_attr("shape", std::nullopt, "logical shape of the unpacked tensor"));
  d.attrs.push_back(string_attr("dtype", "auto", {"auto", "f32", "f64", "f16", "bf16"},
                                "output dtype (auto: the scale's dtype)"));
  d.infer = infer_unpack_dequantize;
  d.parse_args = parse_packed_args;
  d.kernels.push_back({DeviceType::cpu, {DType::u8}, int4_unpack_dequantize_cpu});
#ifdef QG_WITH_CUDA
  add_int4_cuda_kernels(r);
#endif
  add_int4_crosscheck(r);
}

}  // namespace qg
